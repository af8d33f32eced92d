"""The CPU the tuned kernels are compiled for, and the tile sizes that go with it, in one place.

Numba compiles for the host unless told otherwise: ``NUMBA_CPU_NAME`` names another CPU (``haswell``
for AVX2, ``skylake-avx512``, ``generic``) and ``NUMBA_CPU_FEATURES`` the instruction sets, as
LLVM spells them (``+avx2,-avx512f``). When only the name is set, Numba passes the *host's*
features along with it, so ``NUMBA_CPU_NAME=haswell`` alone on an AVX-512 host still compiles
AVX-512 code; to compile for AVX2 there, also set ``NUMBA_CPU_FEATURES=-avx512f`` (or ``""``:
the named CPU's own). :func:`vector_bytes` follows those same rules, so the vectors are as wide
as the registers of the code that is actually compiled, whatever machine compiles it.

The register tile (:data:`TILE_ROWS` queries by :data:`TILE_VECTORS` vectors of keys) must keep
its running sums in registers: ``rows * vectors`` sums, plus the vectors loaded and one broadcast
number. AVX2 has 16 vector registers (8 float32 each); AVX-512 has 32 (16 float32 each).
"""
from __future__ import annotations

# CPUs whose widest vectors are 64 bytes (AVX-512) or 32 bytes (AVX, AVX2), as LLVM names them.
_AVX512_CPUS = {"skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
                "icelake-server", "tigerlake", "rocketlake", "sapphirerapids", "graniterapids",
                "emeraldrapids", "knl", "knm", "znver4", "znver5", "x86-64-v4"}
_AVX_CPUS = {"sandybridge", "ivybridge", "haswell", "broadwell", "skylake", "alderlake", "raptorlake",
             "meteorlake", "arrowlake", "lunarlake", "gracemont", "znver1", "znver2", "znver3",
             "bdver1", "bdver2", "bdver3", "bdver4", "btver2", "x86-64-v3", "corei7-avx", "core-avx-i",
             "core-avx2"}
_AVX_FEATURES = ("avx", "avx2")


def vector_bytes(cpu_name: str | None, cpu_features: str | None, host_name: str, host_features: str) -> int:
    """The width in bytes of the widest SIMD registers of the code Numba compiles.

    ``cpu_name`` / ``cpu_features``: ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` (None when unset);
    ``host_name`` / ``host_features``: LLVM's view of this machine (a comma-separated ``+f,-g``
    list). As in Numba, unset features mean the host's, and features override the CPU's own.
    """
    name = (host_name if cpu_name in (None, "host") else cpu_name).lower()
    width = 64 if name in _AVX512_CPUS else 32 if name in _AVX_CPUS else 16
    features = host_features if cpu_features is None else cpu_features
    for flag in (f.strip().lower() for f in features.split(",") if f.strip()):
        sign, feature = flag[0], flag[1:]
        if feature == "avx512f":
            width = 64 if sign == "+" else min(width, 32)
        elif feature in _AVX_FEATURES:
            width = max(width, 32) if sign == "+" else 16
    return width


def registers(width: int) -> int:
    """Vector registers the compiled code has: 32 with AVX-512, else 16 (AVX2, SSE, NEON)."""
    return 32 if width >= 64 else 16


def _compile_target() -> tuple[str | None, str | None, str, str]:
    import llvmlite.binding as llvm
    from numba.core import config
    return config.CPU_NAME, config.CPU_FEATURES, llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


VECTOR_BYTES = vector_bytes(*_compile_target())
REGISTERS = registers(VECTOR_BYTES)
# What this machine itself could run (the widest vectors of its own CPU), for benchmarks that
# compile for a narrower target and must hold the libraries they compare against to it too.
HOST_VECTOR_BYTES = vector_bytes(None, None, *_compile_target()[2:])

# The register tile: 4 queries (or rows of weights) by TILE_VECTORS vectors of keys (or value
# features), as wide as the register file allows: 4 x 4 on AVX-512 (16 running sums + 4 loaded
# vectors + 1 broadcast = 21 of its 32 registers), 4 x 2 elsewhere (8 + 2 + 1 = 11 of 16, the
# shape of OpenBLAS's Haswell sgemm kernel). tiles.py writes both blocks out by hand and picks
# one by the key panels' width (TILE_VECTORS vectors, see _transpose_keys); a build for 16
# registers compiles the 4 x 2 block alone (tiles.WIDE_TILES).
TILE_ROWS = 4
TILE_VECTORS = 4 if REGISTERS >= 32 else 2
assert TILE_ROWS * TILE_VECTORS + TILE_VECTORS + 1 <= REGISTERS

# Keys per tile of the fused kernel. A tile's key panels and value rows are read once per group of
# four queries: at 512 keys and d_k = d_v = 64 that is 256 KiB, in L2 (512 KiB per core on the AVX2
# machine, 1 MiB or more on the AVX-512 one). Measured on both (T = 512, d_k = 64), 512 keys ran
# faster than 128 and 64: fewer rescales, longer loops per weighted sum.
KEY_BLOCK = 512


def describe(dtype_bytes: int = 4) -> str:
    """One line for benchmarks and pages: vector width and the tile shape."""
    lanes = VECTOR_BYTES // dtype_bytes
    isa = {64: "AVX-512", 32: "AVX2/AVX"}.get(VECTOR_BYTES, "SSE/NEON (16-byte)")
    return (f"{isa} target: {VECTOR_BYTES}-byte vectors ({lanes} float32), {REGISTERS} vector registers; "
            f"register tile {TILE_ROWS} queries x {TILE_VECTORS} vectors ({TILE_ROWS} x {TILE_VECTORS * lanes} "
            f"scores), key panels of {TILE_VECTORS * lanes} keys, key block {KEY_BLOCK} keys")
