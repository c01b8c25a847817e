"""readers.remote.block_memory: each answer counted once, whole, while any of its blocks is kept, and
an answer's blocks leaving together."""

from __future__ import annotations

from readers.remote.block_memory import BlockMemory


def test_an_answers_blocks_go_together_when_the_memory_is_full():
    """A block alone frees nothing while its answer's other blocks are kept: the oldest answer goes
    whole, and the others stay."""
    memory = BlockMemory(100)
    for name in ("a", "b"):  # two answers of 4 blocks of 10 bytes
        view = memoryview(bytes(40))
        for n in range(4):
            memory.put((name, n), view[10 * n : 10 * (n + 1)])
    memory.get(("a", 0))  # one block of the oldest answer read again
    view = memoryview(bytes(40))
    for n in range(4):
        memory.put(("c", n), view[10 * n : 10 * (n + 1)])
    assert memory.held == 80 and sorted({k[0] for k in memory.blocks}) == ["b", "c"]


def test_the_memory_counts_each_answer_whole_while_any_of_its_blocks_is_kept():
    memory = BlockMemory(100)
    answer = bytes(60)
    view = memoryview(answer)
    for n in range(3):  # three blocks of one answer of 60 bytes
        memory.put(("f", n), view[20 * n : 20 * (n + 1)])
    assert memory.held == 60
    memory.put(("g", 0), bytes(50))  # over the limit: blocks go, oldest first, until the answer does
    assert memory.held <= 100 and memory.held == sum({id(a): len(a) for a, _ in memory.answers.values()}.values())
    memory.drop(("g", 0))
    for key in list(memory.blocks):
        memory.drop(key)
    assert memory.held == 0 and memory.answers == {}
