"""What each lesson driver runs, by name and in order: its kernels and, on the GPU, the device
helpers they call. The pages show what the dispatch reads from a driver's own code
(``dispatch.functions_of``); these tables are what the tests expect it to read."""
import numpy as np

from core.kernels import reference as ref

DRIVERS = ["scaled_scores", "attention_with_weights", "attention_with_scores", "weighted_sum", "fused_attention",
           "project_heads", "merge_heads_project", "sinusoidal"]

LESSON_CPU = {
    "scaled_scores": ("scores_kernel", "add_mask_kernel"),
    "attention_with_weights": ("attention_steps", "scores_kernel", "add_mask_kernel", "softmax_kernel",
                               "weighted_sum_kernel"),
    "attention_with_scores": ("attention_steps", "scores_kernel", "add_mask_kernel", "softmax_kernel",
                              "weighted_sum_kernel"),
    "weighted_sum": ("weighted_sum_kernel",),
    "fused_attention": ("fused_attention_kernel",),
    "project_heads": ("project_heads_kernel",),
    "merge_heads_project": ("merge_heads_project_kernel",),
    "sinusoidal": ("sinusoidal_kernel",),
}

LESSON_GPU = {
    "scaled_scores": ("scores_kernel", "add_mask_kernel", "position", "dot", "mask_entry"),
    "attention_with_weights": ("scores_kernel", "add_mask_kernel", "softmax_kernel", "weighted_sum_kernel",
                               "position", "dot", "mask_entry", "softmax_row"),
    "attention_with_scores": ("scores_kernel", "add_mask_kernel", "softmax_kernel", "weighted_sum_kernel",
                              "position", "dot", "mask_entry", "softmax_row"),
    "weighted_sum": ("weighted_sum_kernel", "position", "dot"),
    "fused_attention": ("fused_attention_kernel", "load_rows", "dot", "mask_entry", "online_step"),
    "project_heads": ("project_heads_kernel", "position"),
    "merge_heads_project": ("merge_heads_project_kernel",),
    "sinusoidal": ("sinusoidal_kernel",),
}


def table_of(module) -> dict:
    """``{driver: (function, ...)}`` of the lesson module ``module`` (``core.kernels.cpu`` or ``.gpu``)."""
    names = LESSON_GPU if module.__name__.endswith("gpu") else LESSON_CPU
    return {driver: tuple(getattr(module, name) for name in table) for driver, table in names.items()}


def cpu_kernels(module) -> set:
    """Every compiled function the CPU lesson drivers run."""
    return {f for functions in table_of(module).values() for f in functions}


# --- the cases every lesson driver runs on ---------------------------------------------------------

# (B, H, Tq, Tk, d_k, d_v): Tq != Tk, d_k != d_v, odd sizes, batch and heads > 1; none of the
# lengths is a multiple of the patched block (4 threads) or key tile (3 keys) except by chance
SHAPES = {
    "one": (1, 1, 1, 1, 2, 3),
    "square": (1, 2, 6, 6, 4, 3),
    "cross": (2, 1, 5, 9, 3, 2),
    "batched": (2, 3, 7, 7, 5, 4),
}

# (shape, mask): together they broadcast the mask along every axis and mask whole rows
CASES = [
    ("one", "none"), ("one", "causal"),
    ("square", "none"), ("square", "causal"), ("square", "dead_row"),
    ("cross", "none"), ("cross", "padding"), ("cross", "random"),
    ("batched", "causal"), ("batched", "padding"), ("batched", "random"),
]


def make_mask(name, B, H, Tq, Tk, rng):
    """A 4-D additive mask ``(Bm, Hm, Tqm, Tkm)``, each axis 1 or full size, as core.attention passes."""
    if name == "none":
        return np.zeros((1, 1, 1, 1))
    if name == "causal":                          # (1, 1, T, T)
        return ref.causal_mask(Tq)[None, None]
    if name == "padding":                         # (B, 1, 1, Tk): sequence 0 keeps its first Tk - 3 keys
        lengths = [max(1, Tk - 3)] + [Tk] * (B - 1)
        return ref.padding_mask(lengths, Tk)[:, :, None, :]
    if name == "dead_row":                        # (1, H, Tq, 1): head 0, query 1 may look nowhere
        M = np.zeros((1, H, Tq, 1))
        M[0, 0, 1, 0] = -np.inf
        return M
    if name == "random":                          # (B, H, Tq, Tk): finite values, holes, a dead row
        M = rng.normal(scale=2.0, size=(B, H, Tq, Tk))
        M[rng.random(M.shape) < 0.3] = -np.inf
        M[-1, -1, 0, :] = -np.inf
        return M
    raise KeyError(name)


def make_case(shape_name, mask_name, dtype, seed=0):
    """Q, K, V, mask and scale for one case; the scale is a Python float, as core.attention passes."""
    B, H, Tq, Tk, d_k, d_v = SHAPES[shape_name]
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((B, H, Tq, d_k)).astype(dtype)
    K = rng.standard_normal((B, H, Tk, d_k)).astype(dtype)
    V = rng.standard_normal((B, H, Tk, d_v)).astype(dtype)
    mask = make_mask(mask_name, B, H, Tq, Tk, rng).astype(dtype)
    return Q, K, V, mask, d_k ** -0.5
