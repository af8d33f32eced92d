"""Files from the Hugging Face Hub, with huggingface_hub, into its usual cache (``HF_HOME``).

Two kinds of request:

- a packaged model's published files (:func:`fetch_published`), where its package is not installed:
  pinned to a commit, and each checked against its published size and sha256 before it is used (the
  Hub client does not check the bytes it stores). A file that fails is removed from the cache, so the
  next try fetches it afresh.
- another checkpoint by its Hub name (:func:`download_checkpoint`): its files' sizes are asked of the
  Hub first, and a checkpoint over ``core.limits.MAX_CHECKPOINT_MB`` is refused before a byte of it is
  downloaded.

Every download reports ``progress(fraction, message)`` as its bytes arrive (the page draws a bar). The
Hub's size question is also how we learn that the network is not there: it fails at once, where a
download left to itself retries for about 20 s first.
"""
from __future__ import annotations

import inspect
import os
from typing import Callable, Sequence

from core.model import checkpoint_policy
from core.model.packaged import INSTALL, Published, check_file

Progress = Callable[[float, str], None]
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def fetch_published(files: Sequence[Published], what: str, progress: Progress | None = None) -> list[str]:
    """The published ``files`` (one repository, one revision), each checked against its published size
    and sha256; their paths in huggingface_hub's cache, in order. Files already in the cache are
    checked and used with no network call; the others are fetched first.

    ``what`` names the model in messages ("all-MiniLM-L6-v2"). A file the Hub does not give (offline,
    or no such file) or gives with other bytes is a ValueError that says how to install the package
    instead; a file with other bytes is removed from the cache.
    """
    paths = {f.filename: _in_cache(f.repo, f.filename, f.revision) for f in files}
    missing = [f for f in files if paths[f.filename] is None]
    try:
        for f in missing:                                 # every size first: nothing downloaded if one is wrong
            size = _size_on_hub(f.repo, f.filename, f.revision)
            if size != f.size:
                raise ValueError(f"The Hub gives {f.filename} of {f.repo} at {f.revision[:12]} as {size:,} bytes, "
                                 f"not the published {f.size:,}: it is not the published file, so it is not "
                                 f"downloaded. Install {what} instead with: {INSTALL}")
        fetched = _download([(f.repo, f.filename, f.revision, f.size) for f in missing], what, progress)
    except _Unreachable as err:
        raise ValueError(f"{what} is not installed, and could not be fetched from the Hugging Face Hub "
                         f"({files[0].repo} at {files[0].revision[:12]}, {err.filename}: {err.reason}). Install it "
                         f"with: {INSTALL}") from None
    paths.update(zip([f.filename for f in missing], fetched))
    for f in files:
        if progress:
            progress(1.0, f"Checking {what}: {f.filename} against its published sha256")
        _check_or_remove(paths[f.filename], f, what)
    return [paths[f.filename] for f in files]


def download_checkpoint(name: str, files: Sequence[str] = CHECKPOINT_FILES, progress: Progress | None = None,
                        *, revision: str = "main") -> str:
    """The folder, in huggingface_hub's cache, that holds the Hub checkpoint ``name``'s ``files``.

    The request is checked against the instructor's setting (:func:`checkpoint_policy.check_checkpoint_request`),
    and the files' sizes, as the Hub gives them, against ``core.limits.MAX_CHECKPOINT_MB`` before a byte is
    downloaded. Offline, files cached earlier are used (their sizes checked the same way); anything else
    that cannot be fetched is a ValueError that says how to load the checkpoint from a folder instead.
    """
    checkpoint_policy.check_checkpoint_request(name)
    try:
        sizes = {filename: _size_on_hub(name, filename, revision) for filename in files}
    except _Unreachable as err:
        return _cached_checkpoint(name, files, revision, err)
    checkpoint_policy.check_checkpoint_size(name, sizes)
    try:
        paths = _download([(name, f, revision, sizes[f]) for f in files], name, progress)
    except _Unreachable as err:
        raise ValueError(_folder_instead(name, err)) from None
    return os.path.dirname(paths[0])


def _cached_checkpoint(name: str, files: Sequence[str], revision: str, err: "_Unreachable") -> str:
    """Offline: the checkpoint's folder when every file was cached before (sizes checked), else the
    message that says how to load it from a folder."""
    cached = [_in_cache(name, filename, revision) for filename in files]
    if None in cached:
        raise ValueError(_folder_instead(name, err)) from None
    checkpoint_policy.check_checkpoint_size(name, {f: os.path.getsize(p) for f, p in zip(files, cached)})
    return os.path.dirname(cached[0])


def _folder_instead(name: str, err: "_Unreachable") -> str:
    return (f"Could not fetch {err.filename} of {name!r} from the Hugging Face Hub ({err.reason}). Without a "
            f"network, put the checkpoint in a folder instead: config.json, model.safetensors and tokenizer.json "
            f"from https://huggingface.co/{name}/tree/main, and give that folder's path.")


# ----------------------------------------------------------------------------------------------
# the Hub's answers, the cache, the download
# ----------------------------------------------------------------------------------------------
class _Unreachable(Exception):
    """The Hub did not give a file: no network, no such repository, revision or file, or the Hub down."""

    def __init__(self, filename: str, reason: str):
        super().__init__(f"{filename}: {reason}")
        self.filename, self.reason = filename, reason


def _size_on_hub(repo: str, filename: str, revision: str) -> int:
    """The file's size as the Hub gives it: a HEAD request, nothing downloaded, no retries."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        size = get_hf_file_metadata(hf_hub_url(repo, filename, revision=revision)).size
    except Exception as err:                      # offline, unknown repository or file, Hub down: one answer
        raise _Unreachable(filename, type(err).__name__) from None
    if size is None:
        raise _Unreachable(filename, "the Hub did not say how large it is")
    return size


def _in_cache(repo: str, filename: str, revision: str) -> str | None:
    """The file's path in huggingface_hub's cache, or None; no network call."""
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo, filename, revision=revision)
    return path if isinstance(path, str) and os.path.isfile(path) else None


def _download(requests: list[tuple[str, str, str, int]], what: str, progress: Progress | None) -> list[str]:
    """Each ``(repo, filename, revision, size)`` downloaded in turn; their paths. ``progress`` hears each
    file's bytes as a share of all the bytes, so the bar moves as the bytes arrive."""
    total = sum(size for *_, size in requests)
    done, paths = 0, []
    for repo, filename, revision, size in requests:
        paths.append(_download_one(repo, filename, revision, size, what, done, total, progress))
        done += size
    if progress and requests:
        progress(1.0, f"Downloaded {what}")
    return paths


def _download_one(repo: str, filename: str, revision: str, size: int, what: str, done: int, total: int,
                  progress: Progress | None) -> str:
    """One file into the cache; its path. ``done`` of the ``total`` bytes came before it."""
    from huggingface_hub import hf_hub_download

    def report(received: int) -> None:
        if progress:
            part = done + min(received, size)
            progress(part / total, f"Downloading {what}: {filename} ({part / 1e6:,.1f} of {total / 1e6:,.1f} MB)")

    report(0)
    takes_bar = "tqdm_class" in inspect.signature(hf_hub_download).parameters     # huggingface_hub 1.0 on
    try:
        return hf_hub_download(repo, filename, revision=revision,
                               **({"tqdm_class": _byte_counter(report)} if takes_bar else {}))
    except Exception as err:                      # the network lost half way, or the Hub changed its answer
        raise _Unreachable(filename, type(err).__name__) from None


def _byte_counter(report: Callable[[int], None]):
    """A progress-bar class, the kind huggingface_hub takes as ``tqdm_class``, that draws nothing and
    tells ``report`` how many of the file's bytes have arrived. A download may open two bars on one
    file (bytes received, bytes written): the larger count is reported, so the bar never runs back."""
    from tqdm import tqdm

    best = 0

    class ByteCounter(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": True})      # nothing on the server's terminal
            self.received = kwargs.get("initial") or 0

        def update(self, n=1):
            nonlocal best
            self.received += n
            if self.received > best:
                best = self.received
                report(best)
            return super().update(n)

    return ByteCounter


def _check_or_remove(path: str, published: Published, what: str) -> None:
    """:func:`packaged.check_file` on a cached file; one that fails is removed from the cache (the
    snapshot's entry and the bytes it points to) before the refusal is raised."""
    try:
        check_file(path, published.size, published.sha256,
                   remedy=f"It is removed from the download cache, so loading {what} again fetches it afresh; "
                          f"or install it with: {INSTALL}")
    except ValueError:
        for p in {path, os.path.realpath(path)}:
            if os.path.lexists(p):
                os.remove(p)
        raise
