"""Prefix cache: identical greedy tokens with and without it, block/LRU/size rules, stats."""
from __future__ import annotations

import pytest
import torch

from llm_fixtures import build_model
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.engine.llm.prefix_cache import PrefixCache

GREEDY = GenerationConfig(max_tokens=6, stop_token_ids=())


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3pc")
    build_model("qwen3", path, seed=3)
    return path


def _prompts():
    g = torch.Generator().manual_seed(0)
    system = torch.randint(5, 390, (150,), generator=g).tolist()     # 2 full blocks + a part
    return system, [system + torch.randint(5, 390, (n,), generator=g).tolist() for n in (9, 40)]


@pytest.mark.parametrize("precision", ["bf16"])
def test_greedy_tokens_identical_with_and_without(qwen_dir, precision):
    system, prompts = _prompts()
    plain = load_decoder(qwen_dir, precision, max_context=256, quiet=True, prefix_cache=0)
    want = [plain.complete(p, GREEDY).token_ids for p in prompts]
    plain.close()
    eng = load_decoder(qwen_dir, precision, max_context=256, quiet=True, prefix_cache=64 << 20)
    first = eng.complete(prompts[0], GREEDY)
    assert first.stats.cached_tokens == 0 and first.token_ids == want[0]
    second = eng.complete(prompts[1], GREEDY)      # shares the 150-token system prefix
    assert second.stats.cached_tokens == 128 and second.token_ids == want[1]
    # a follow-up turn: the earlier prompt + its answer + more; reuses beyond the shared prefix
    turn = prompts[1] + second.token_ids + [7, 8, 9]
    again = eng.complete(turn, GREEDY)
    assert again.stats.cached_tokens == 192
    plain = load_decoder(qwen_dir, precision, max_context=256, quiet=True, prefix_cache=0)
    assert again.token_ids == plain.complete(turn, GREEDY).token_ids
    assert eng.prefix_cache.stats.hits == 2
    plain.close()
    eng.close()


def test_modeled_prefill_saved(qwen_dir):
    system, prompts = _prompts()
    eng = load_decoder(qwen_dir, "bf16", max_context=256, quiet=True, prefix_cache=64 << 20)
    cold = eng.complete(prompts[1], GREEDY).stats
    warm = eng.complete(prompts[1], GREEDY).stats
    assert warm.cached_tokens == 128
    assert warm.modeled_prefill_us < cold.modeled_prefill_us
    eng.close()


def test_block_keys_lru_and_size_bound(qwen_dir):
    eng = load_decoder(qwen_dir, "bf16", max_context=256, quiet=True, prefix_cache=0)
    dec = eng.decoder
    per_block = dec.cache.nbytes * 64 // dec.capacity
    pc = PrefixCache(max_bytes=2 * per_block)
    a, b = list(range(5, 155)), list(range(200, 350))
    assert pc.keys(a[:64]) == pc.keys(a[:100]) and pc.keys(a[:63]) == []
    assert pc.keys(a)[1] != pc.keys(b[:64] + a[64:128])[1]      # a block's key names its prefix
    dec.reset()
    dec.forward(a)
    assert pc.store(dec.dev, dec.cache, a) == 2 and pc.bytes == 2 * per_block   # 3rd block partial
    assert pc.store(dec.dev, dec.cache, a) == 0                                 # already cached
    dec.reset()
    dec.forward(b)
    pc.store(dec.dev, dec.cache, b)                   # evicts a's blocks (LRU) to stay bounded
    assert pc.bytes <= 2 * per_block and pc.stats.evicted_blocks == 2
    assert pc.restore(dec.dev, dec.cache, a) == 0 and dec.cache.length == 0
    assert pc.restore(dec.dev, dec.cache, b) == 128 and dec.cache.length == 128
    assert pc.restore(dec.dev, dec.cache, b[:128]) == 64      # one token always left to prefill
    assert PrefixCache(max_bytes=per_block - 1).store(dec.dev, dec.cache, b) == 0
    small = PrefixCache(max_bytes=per_block)
    assert small.store(dec.dev, dec.cache, b) == 1 and small.restore(dec.dev, dec.cache, b) == 64
    with pytest.raises(ValueError, match="block"):
        PrefixCache(1, block=0)
    eng.close()
