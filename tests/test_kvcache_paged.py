"""PagedAttention's bookkeeping: block tables, the free list, reference counts, copy-on-write, prefix sharing."""
import random

import pytest
import torch

import labkit
from labkit.kvcache.paged import BlockManager, BlockPool, PagedCache, hash_block
from tests.kvcache_shared import ids, run_pieces, tiny


def _invariants(pool: BlockPool, caches) -> None:
    m = pool.manager
    assert m.n_used + m.n_free == pool.num_blocks
    counted = [0] * pool.num_blocks
    for cache in caches:
        for table in cache.block_tables:
            for block in table:
                counted[block] += 1
    assert counted == m.ref_count  # every reference is a table entry
    assert sorted(m.free) == [b for b in range(pool.num_blocks) if counted[b] == 0]
    assert len(set(m.free)) == len(m.free)


def test_block_table_maps_tokens_to_slots_and_wastes_less_than_a_block():
    model = tiny()
    cache = model.new_cache("paged", max_len=64, block_size=5)
    run_pieces(model, ids(23), cache, [11, 1, 1, 10])
    assert cache.block_tables == [[0, 1, 2, 3, 4]]
    assert cache.bytes_allocated() - cache.bytes_used() == 2 * cache.bytes_used() // 23  # 25 slots for 23 tokens
    assert 0 < cache.fragmentation() <= 4 / 25


@torch.inference_mode()
def test_fork_then_copy_on_write_leaves_the_parent_untouched():
    model = tiny(seed=2)
    x = ids(10, seed=3)
    parent = model.new_cache("paged", max_len=32, block_size=4, num_blocks=12)
    model(x, cache=parent)
    keys_before = [parent.layer_kv(layer)[0].clone() for layer in range(2)]
    used_before = parent.pool.manager.n_used
    child = parent.fork()
    assert parent.pool.manager.n_used == used_before  # a fork copies no block
    assert child.block_tables == parent.block_tables
    child_logits = model(torch.tensor([[5]]), cache=child)  # writes into the shared, half-full block 2
    assert child.block_tables[0][:2] == parent.block_tables[0][:2]  # full blocks stay shared
    assert child.block_tables[0][2] != parent.block_tables[0][2]  # the written block was copied
    assert parent.pool.manager.n_used == used_before + 1
    for layer in range(2):
        assert torch.equal(parent.layer_kv(layer)[0], keys_before[layer])
    # the parent continues exactly as a cache that was never forked
    alone = model.new_cache("paged", max_len=32, block_size=4)
    model(x, cache=alone)
    assert torch.equal(model(torch.tensor([[7]]), cache=parent), model(torch.tensor([[7]]), cache=alone))
    # and the child equals a fresh run of its own sequence
    torch.testing.assert_close(child_logits[0, -1], model(torch.cat([x, torch.tensor([[5]])], 1))[0, -1], atol=2e-5, rtol=0)
    _invariants(parent.pool, [parent, child])
    parent.release(), child.release()
    assert parent.pool.manager.ref_count == [0] * 12 and parent.pool.manager.n_free == 12


@torch.inference_mode()
def test_prefix_sharing_reuses_full_blocks_only_and_only_at_the_same_position():
    model = tiny(seed=4)
    pool = BlockPool(model.config, num_blocks=16, block_size=4)
    prompt = ids(10, seed=5)[0].tolist()  # blocks [0:4], [4:8] full, [8:10] partial
    first = PagedCache(model.config, block_size=4, pool=pool, max_len=32)
    s1 = labkit.prefill(model, prompt, cache=first)
    assert len(pool.manager.hash_to_block) == 2  # the partial block is never cached

    second = PagedCache(model.config, block_size=4, pool=pool, max_len=32)
    other = prompt[:8] + [1, 2, 3, 4, 5]
    before = pool.manager.n_used
    s2 = labkit.prefill(model, other, cache=second)
    assert second.block_tables[0][:2] == first.block_tables[0][:2]  # same physical blocks
    assert pool.manager.n_used == before + 2  # only the new tokens' blocks were allocated
    torch.testing.assert_close(s2.logits, model(torch.tensor([other]))[0, -1], atol=2e-5, rtol=0)
    _invariants(pool, [first, second])

    shifted = PagedCache(model.config, block_size=4, pool=pool, max_len=32)  # same tokens, other position
    assert shifted.reuse_prefix([9] + prompt[:8] + [1]) == 0
    assert shifted.reuse_prefix(prompt[:8]) == 4  # one token is always left to compute: block 2 is not reused
    shifted.release()

    # released blocks keep their hash until reused for something else (LRU)
    first.release(), second.release()
    assert pool.manager.n_used == 0 and pool.manager.ref_count == [0] * 16
    third = PagedCache(model.config, block_size=4, pool=pool, max_len=32)
    assert third.reuse_prefix(prompt) == 8
    assert s1.cache is first
    _invariants(pool, [third])


def test_allocation_takes_the_least_recently_freed_block_and_forgets_its_hash():
    m = BlockManager(3)
    a, b = m.allocate(), m.allocate()
    h = hash_block(b"", [1, 2])
    m.register(a, h)
    m.decref(a), m.decref(b)  # free list: [2, a, b]
    assert m.lookup(h) == a
    assert [m.allocate(), m.allocate()] == [2, a] and m.lookup(h) is None
    with pytest.raises(ValueError, match="out of KV blocks: all 3 blocks are in use"):
        m.allocate(), m.allocate()
    with pytest.raises(RuntimeError, match="already free"):
        BlockManager(1).decref(0)


def test_hash_chains_depend_on_the_parent():
    assert hash_block(b"", [1, 2]) == hash_block(b"", [1, 2])
    assert hash_block(hash_block(b"", [3, 4]), [1, 2]) != hash_block(b"", [1, 2])


@torch.inference_mode()
def test_random_fork_decode_release_keeps_the_books_balanced():
    model = tiny(n_layers=1)
    pool = BlockPool(model.config, num_blocks=40, block_size=3)
    rng = random.Random(0)
    live = [PagedCache(model.config, block_size=3, pool=pool, max_len=30)]
    model(ids(5), cache=live[0])
    for step in range(60):
        op = rng.random()
        if op < 0.3 and len(live) < 6:
            live.append(rng.choice(live).fork())
        elif op < 0.45 and len(live) > 1:
            live.pop(rng.randrange(len(live))).release()
        else:
            cache = rng.choice(live)
            if cache.seq_len < 30 and pool.manager.n_free > 1:
                model(torch.tensor([[rng.randrange(61)]]), cache=cache)
        _invariants(pool, live)
    for cache in live:
        cache.release()
    assert pool.manager.ref_count == [0] * 40


def test_running_out_of_blocks_is_a_clear_error_that_changes_nothing():
    model = tiny()
    cache = model.new_cache("paged", max_len=32, block_size=4, num_blocks=2)
    model(ids(6), cache=cache)
    with pytest.raises(ValueError, match="out of KV blocks: 4 new tokens need 1 blocks, 0 of 2 are free"):
        model(ids(4), cache=cache)
    assert cache.seq_len == 6 and cache.block_tables == [[0, 1]]


@torch.inference_mode()
def test_one_store_a_request_cache_and_the_serving_batch_share_blocks():
    """PagedCache and PagedBatch are two views of one BlockPool: a prefix one computed, the other adopts."""
    from labkit.kvcache.batch import PagedBatch

    model = tiny(seed=6)
    pool = BlockPool(model.config, num_blocks=16, block_size=4)
    prompt = ids(11, seed=7)[0].tolist()
    single = PagedCache(model.config, block_size=4, pool=pool, max_len=32)
    labkit.prefill(model, prompt, cache=single)  # registers blocks [0:4] and [4:8]
    batch = PagedBatch(model.config, block_size=4, pool=pool)
    assert batch.block_bytes() == single.pool.block_bytes() == pool.block_bytes()
    batch.add("r")
    cached = pool.tables.cached_prefix(prompt)
    assert cached == single.block_tables[0][:2]
    pool.tables.free("r")
    assert pool.tables.adopt("r", cached) == 8
    batch.plan([("r", 3)])
    logits = model(torch.tensor([prompt[8:]]), cache=batch, last_only=True)[0, 0]
    torch.testing.assert_close(logits, model(torch.tensor([prompt]))[0, -1], atol=2e-5, rtol=0)
    _invariants(pool, [single, type("Rows", (), {"block_tables": [pool.tables.tables["r"]]})()])
    keys, values = batch.export_kv("r")
    assert torch.equal(keys[:, :8], torch.stack([single.layer_kv(layer)[0][0].transpose(0, 1)[:8] for layer in range(2)]))
