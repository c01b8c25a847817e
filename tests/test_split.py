"""A conversion split over nodes (--num-nodes/--node-rank) and packer merge: equal to a single run,
refusals that name what is wrong, nodes that run at the same time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from compare import assert_same_output
from conftest import FORMATS, make_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ShardSize
from packer.ops.nodes import NodeSplit, convert_node, merge
from packer.output.files import staging_dir
from packer.output.verify import verify
from packer.spec.errors import OutputError
from packer.spec.manifest import read_manifest

PRE = PreprocessConfig(size=(16, 12))


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """16 PNGs in 2 classes, a corrupt file and an ignored text file."""
    root = tmp_path_factory.mktemp("src") / "images"
    make_tree(root, {"ant": 8, "bee": 8})
    (root / "bee" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    (root / "ant" / "notes.txt").write_text("not an image")
    return root


def run_nodes(tree: Path, out: Path, config: ConvertConfig, nodes: int, workers: int = 1) -> None:
    for rank in range(nodes):
        convert_node(tree, out, config, NodeSplit(nodes, rank), workers=workers)


@pytest.mark.parametrize("fmt", FORMATS)
def test_split_then_merge_equals_a_single_run(tree, tmp_path, fmt):
    """--shard-size auto too: 3 nodes x 2 workers plan as a single run with -j 6."""
    config = ConvertConfig(fmt, PRE, ShardSize(samples=3) if fmt == "lmdb" else ShardSize())
    convert(tree, tmp_path / "single", config, workers=6)
    run_nodes(tree, tmp_path / "split", config, nodes=3, workers=2)
    assert not (tmp_path / "split").exists()  # nothing is an output before the merge
    result = merge(tmp_path / "split")
    assert [s.path for s in result.skipped] == ["bee/broken.png"]
    assert_same_output(tmp_path / "single", tmp_path / "split")
    assert verify(tmp_path / "split") == []
    assert not staging_dir(tmp_path / "split").exists()


def test_nodes_take_every_nth_shard(tree, tmp_path):
    config = ConvertConfig("npy", PRE, ShardSize(samples=4))
    first = convert_node(tree, tmp_path / "out", config, NodeSplit(2, 1))
    assert (first.shards, first.total_shards, first.written) == (2, 5, 2)  # 17 files, 4 a shard
    names = sorted(p.name.split(".")[0] for p in staging_dir(tmp_path / "out").glob("shard-*.labels.npy"))
    assert names == ["shard-00001", "shard-00003"]


def test_merge_names_missing_and_damaged_shards_and_their_nodes(tree, tmp_path):
    out = tmp_path / "out"
    config = ConvertConfig("wds", PRE, ShardSize(samples=4))
    convert_node(tree, out, config, NodeSplit(2, 0))
    missing = r"2 of 5 shards .*shard-00001 \(node 1\), shard-00003 \(node 1\)\. Run node\(s\) 1 again"
    with pytest.raises(OutputError, match=missing):
        merge(out)
    convert_node(tree, out, config, NodeSplit(2, 1))
    tar = staging_dir(out) / "shard-00002.tar"
    data = bytearray(tar.read_bytes())
    data[700] ^= 0xFF
    tar.write_bytes(bytes(data))
    with pytest.raises(OutputError, match=r"1 of 5 shards .*shard-00002 \(node 0\)"):
        merge(out)
    again = convert_node(tree, out, config, NodeSplit(2, 0))  # redoes only the damaged shard
    assert (again.written, again.shards) == (1, 3)
    merge(out)
    convert(tree, tmp_path / "single", config, workers=2)
    assert_same_output(tmp_path / "single", out)


def _as_an_older_packers_records(tree: Path, out: Path, nodes: NodeSplit) -> int:
    """Rewrite node ``nodes.rank``'s shard records as packers before XXH3 source digests wrote them
    (SHA-256 prefixes, no ``digest``); how many."""
    import json

    from helpers import as_older_sha256_record

    from packer.output.files import DONE_SUFFIX

    records = sorted(staging_dir(out).glob(f"*{DONE_SUFFIX}"))
    mine = [r for i, r in enumerate(records) if nodes.owner(i) == nodes.rank]
    for record in mine:
        record.write_text(json.dumps(as_older_sha256_record(json.loads(record.read_text()), tree)))
    return len(mine)


def test_merge_takes_records_of_one_digest_only(tmp_path):
    """All nodes' records from an older packer merge (their digests compare among themselves); a
    mix is refused, naming the nodes to run again, which then write those shards again."""
    import shutil

    tree = tmp_path / "images"
    make_tree(tree, {"ant": 8, "bee": 8})
    shutil.copy(tree / "ant" / "img_000.png", tree / "bee" / "img_099.png")  # shards 0 and 4, nodes 0 and 1
    config = ConvertConfig("npy", PRE, ShardSize(samples=4))
    single = convert(tree, tmp_path / "single", config, workers=2)
    assert single.manifest.duplicates == [["ant/img_000.png", "bee/img_099.png"]]
    old = tmp_path / "old"
    run_nodes(tree, old, config, 2)
    for rank in range(2):
        _as_an_older_packers_records(tree, old, NodeSplit(2, rank))
    merge(old)
    assert_same_output(tmp_path / "single", old)
    mixed = tmp_path / "mixed"
    run_nodes(tree, mixed, config, 2)
    assert _as_an_older_packers_records(tree, mixed, NodeSplit(2, 1)) == 2
    with pytest.raises(OutputError, match=r"2 of 5 shards .* older packer.*run node\(s\) 1 again"):
        merge(mixed)
    again = convert_node(tree, mixed, config, NodeSplit(2, 1))
    assert again.written == 2
    merge(mixed)
    assert_same_output(tmp_path / "single", mixed)


def test_nodes_are_refused_once_a_source_file_changed(tmp_path):
    """merge publishes every node's shards without reading the sources, so every node must see the
    files the first one planned with: a node started after a file changed is refused."""
    src = tmp_path / "images"
    make_tree(src, {"ant": 8, "bee": 8})
    out = tmp_path / "out"
    config = ConvertConfig("npy", PRE, ShardSize(samples=4))
    convert_node(src, out, config, NodeSplit(2, 0))
    make_tree(src, {"ant": 1}, size=(30, 30))  # ant/img_000.png, in node 0's finished shard, is another image
    for rank in (1, 0):
        with pytest.raises(OutputError, match="options or source files differ"):
            convert_node(src, out, config, NodeSplit(2, rank))


def test_nodes_with_other_options_are_refused(tree, tmp_path):
    out = tmp_path / "out"
    convert_node(tree, out, ConvertConfig("npy", PRE), NodeSplit(2, 0), workers=1)
    with pytest.raises(OutputError, match="options or source files differ"):
        convert_node(tree, out, ConvertConfig("npy", PreprocessConfig(size=(8, 8))), NodeSplit(2, 1), workers=1)
    with pytest.raises(OutputError, match="split over 2 nodes, this node was started with --num-nodes 3"):
        convert_node(tree, out, ConvertConfig("npy", PRE), NodeSplit(3, 1), workers=1)
    with pytest.raises(OutputError, match="balanced for 2 workers, this node's for 4"):
        convert_node(tree, out, ConvertConfig("npy", PRE), NodeSplit(2, 1), workers=2)
    assert not list(staging_dir(out).glob("shard-00001*"))  # the refused nodes wrote nothing


def test_merge_without_a_split_run(tmp_path):
    with pytest.raises(OutputError, match="no split conversion"):
        merge(tmp_path / "out")


def test_cli_usage_errors(tree, tmp_path):
    base = ["convert", str(tree), "-f", "npy", "-o", str(tmp_path / "o"), "-q"]
    for extra, message in [
        (["--num-nodes", "2"], "go together"),
        (["--num-nodes", "2", "--node-rank", "2"], "--node-rank must be 0 to 1"),
        (["--num-nodes", "2", "--node-rank", "0", "--executor", "ray"], "without Ray"),
        (["--address", "auto"], "--address is for --executor ray"),
    ]:
        result = CliRunner().invoke(cli, base + extra)
        assert result.exit_code == 2 and message in result.output, result.output
    result = CliRunner().invoke(cli, ["merge", str(tmp_path / "o")])
    assert result.exit_code == 1 and "no split conversion" in result.output


def test_nodes_started_together_as_processes_then_merge(tree, tmp_path):
    """Real subprocesses, as a SLURM array starts them: both race to create the shared staging folder."""
    out = tmp_path / "out"
    options = ["-f", "hdf5", "--size", "16x12", "--shard-size", "3", "-j", "1", "-q"]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "packer",
                "convert",
                str(tree),
                "-o",
                str(out),
                *options,
                "--num-nodes",
                "2",
                "--node-rank",
                str(rank),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        assert f"packer merge {out}" in stdout
    merged = subprocess.run(
        [sys.executable, "-m", "packer", "merge", str(out)], capture_output=True, text=True, timeout=60
    )
    assert merged.returncode == 0, merged.stderr
    assert "skipped 1 file(s)" in merged.stderr
    convert(tree, tmp_path / "single", ConvertConfig("hdf5", PRE, ShardSize(samples=3)), workers=2)
    assert_same_output(tmp_path / "single", out)
    assert read_manifest(out).samples == 16


def test_a_container_source_split_over_nodes_equals_a_single_run(tree, tmp_path):
    """Each node's workers read the rows of a Parquet source, not the file as an image (they were
    given no container job: every sample was skipped as corrupt)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(tree.rglob("*.png"))
    rows = [{"bytes": p.read_bytes(), "path": p.relative_to(tree).as_posix()} for p in files]
    pq.write_table(pa.table({"image": rows, "label": [p.parent.name for p in files]}), tmp_path / "t.parquet")
    config = ConvertConfig("npy", PreprocessConfig(size=(16, 12)), ShardSize(samples=4))
    convert(tmp_path / "t.parquet", tmp_path / "single", config, workers=1)
    run_nodes(tmp_path / "t.parquet", tmp_path / "split", config, 2)
    merge(tmp_path / "split")
    assert read_manifest(tmp_path / "split").samples == len(files) - 1 > 4  # all but bee/broken.png
    assert_same_output(tmp_path / "single", tmp_path / "split")
