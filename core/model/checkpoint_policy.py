"""Which checkpoints a server takes beyond its own models: the instructor's setting and the size cap.

A student may type any Hub name or folder as "Another checkpoint". On a laptop that is the point; on
a server a whole class shares, one name can fill its memory or disk, and one path can read a folder
no student should open. Two environment variables, read at every request, say what is taken:

``ATTENTION_CHECKPOINTS``
    ``any`` (the default): any Hub name. ``off``: no other checkpoint at all, neither name nor folder.
    A comma-separated list of Hub names (``gpt2,distilgpt2``): those names only.
``ATTENTION_CHECKPOINT_ROOT``
    A folder: checkpoint folders must be inside it (symbolic links and ``..`` resolved first). Unset:
    any folder, except where ``ATTENTION_CHECKPOINTS`` is a list: a list is the hosted setting, and
    there no folder is taken unless a root says where.

Whatever the setting, a checkpoint larger than ``core.limits.MAX_CHECKPOINT_MB`` is refused: a Hub
name before a byte is downloaded (:mod:`core.model.hub`), a folder before its weights are read. The
packaged models and the small GPT that ships are the app's own, and not this module's business.
"""
from __future__ import annotations

import dataclasses
import os
import re

from core import limits

CHECKPOINTS = "ATTENTION_CHECKPOINTS"
ROOT = "ATTENTION_CHECKPOINT_ROOT"
WEIGHTS_FILE = "model.safetensors"
# A Hub name, as huggingface_hub spells a repository: "name" or "owner/name"
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


@dataclasses.dataclass(frozen=True)
class CheckpointPolicy:
    """What the setting takes: ``names`` the Hub names (None: any); ``folders`` whether folders are
    taken at all; ``root`` the one folder they must be inside (None: anywhere)."""

    names: frozenset[str] | None = None
    folders: bool = True
    root: str | None = None


def policy(environ=os.environ) -> CheckpointPolicy:
    """The setting in ``environ`` (the process's environment); a ValueError, naming the variable, for a
    value that is not one."""
    value = environ.get(CHECKPOINTS, "").strip()
    root = environ.get(ROOT, "").strip() or None
    if value.lower() in ("", "any"):
        return CheckpointPolicy(None, True, root)
    if value.lower() == "off":
        return CheckpointPolicy(frozenset(), False, None)
    names = [name.strip() for name in value.split(",") if name.strip()]
    bad = [name for name in names if not _is_hub_name(name)]
    if bad or not names:
        raise ValueError(f"{CHECKPOINTS}={value!r} is not a setting: give 'any', 'off' or Hub names separated by "
                         f"commas, such as 'gpt2,distilgpt2'" + (f" ({', '.join(map(repr, bad))} is not a Hub name)."
                                                                if bad else "."))
    return CheckpointPolicy(frozenset(names), root is not None, root)


def check_checkpoint_request(source: str) -> None:
    """A ValueError, naming the setting, when the instructor's setting refuses ``source``: a Hub name
    or a folder (a weights file), told apart as :func:`core.pretrained.load` tells them. A folder it
    takes is also held to the size cap (:func:`check_folder_size`). Nothing is read but the setting and,
    for a folder, the size of its weights."""
    if not isinstance(source, str) or not source.strip():
        return                                            # the loader says what to type
    rules = policy()
    source = os.path.expanduser(source.strip())
    if rules.names == frozenset() and not rules.folders:
        raise ValueError(f"This server takes no other checkpoints ({CHECKPOINTS}=off): choose one of the "
                         f"models it offers.")
    if is_hub_name_request(source):
        if rules.names is not None and source not in rules.names:
            raise ValueError(f"This server takes only these Hub checkpoints: {', '.join(sorted(rules.names))} "
                             f"({CHECKPOINTS}); {source!r} is not one of them.")
        return
    if not rules.folders:
        raise ValueError(f"This server takes no checkpoint folders ({CHECKPOINTS} lists Hub names and {ROOT} "
                         f"is not set): give one of the names {', '.join(sorted(rules.names))}.")
    if rules.root is not None and not _inside(source, rules.root):
        raise ValueError(f"{source} is not inside {rules.root}, the folder this server reads checkpoints from "
                         f"({ROOT}): put the checkpoint's folder there and give its path.")
    check_folder_size(source)


def is_hub_name_request(source: str) -> bool:
    """Whether the loader takes ``source`` as a Hub name: spelt as one ("gpt2", "owner/name") and not a
    folder or file on this machine (those are read first)."""
    return _is_hub_name(source) and not os.path.exists(source)


def check_folder_size(path: str) -> None:
    """A ValueError when the weights of a checkpoint folder (its ``model.safetensors``), or a weights file
    itself, are larger than the cap; nothing to say when there are none (the loader says what is missing)."""
    weights = os.path.join(path, WEIGHTS_FILE) if os.path.isdir(path) else path
    if os.path.isfile(weights):
        check_checkpoint_size(path, {os.path.basename(weights): os.path.getsize(weights)})


def check_checkpoint_size(source: str, sizes: dict[str, int]) -> None:
    """A ValueError, naming the cap, when the files ``{name: bytes}`` of ``source`` add up to more than
    ``core.limits.MAX_CHECKPOINT_MB``."""
    total = sum(sizes.values())
    if total > limits.MAX_CHECKPOINT_MB * 1e6:
        largest = max(sizes, key=sizes.get)
        raise ValueError(f"{source} is {total / 1e6:,.0f} MB ({largest}: {sizes[largest] / 1e6:,.0f} MB), over "
                         f"this server's limit of {limits.MAX_CHECKPOINT_MB:,} MB for a checkpoint "
                         f"(core.limits.MAX_CHECKPOINT_MB): a larger one would not fit the memory of a 1 GB "
                         f"server. gpt2 (GPT-2 small, 548 MB) and distilgpt2 (353 MB) fit.")


def _is_hub_name(text: str) -> bool:
    return HUB_NAME.fullmatch(text) is not None and ".." not in text and "--" not in text


def _inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or inside it once both are resolved: symbolic links followed, ``..``
    and ``.`` removed."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root
