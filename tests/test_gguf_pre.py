"""Every pre-tokenizer name llama.cpp knows (models/formats/gguf_pre.py, extracted from llama.cpp's
src/llama-vocab.cpp at 4227c9be) splits text the way llama.cpp's unicode_regex_split does.

Reference: the same regex list run through the `regex` package with llama.cpp's semantics
(each regex splits every piece further; matches and the gaps between them are both kept),
compared with the `tokenizers` pre-tokenizer the GGUF loader builds (Oniguruma). The names that
cannot be rebuilt are refused with the fix. A GGUF tokenizer for the real SmolLM2 file
('smollm') is checked against transformers' own GGUF tokenizer in tests/test_realweights.py."""
from __future__ import annotations

import pytest
import regex

from torch_xdna.models.formats import gguf_pre

SAMPLES = [
    "Hello, world! It's 2025 and we're testing 1234567 digits.",
    "  leading spaces\tand tabs\n\nnew lines\r\nCRLF   trailing   ",
    "Café déjà vu, naïve façade; ÜBER straße.",
    "東京は日本の首都です。한국어 텍스트. Привет, мир!",
    "def f(x):\n    return x**2 + 3.14159  # comment",
    "I'LL SEE YOU'D THEY'VE shouldn't <sentinel:12> $100 +5% a|b ~c ^d",
    "emoji 🙂👍 and math ∑∫ and 1,000,000.00",
]


def reference_split(regexes: tuple[str, ...], text: str) -> list[str]:
    """llama.cpp unicode_regex_split: every regex splits each piece, gaps kept (no byte map)."""
    pieces = [text]
    for r in regexes:
        pat = regex.compile(r)
        out = []
        for p in pieces:
            pos = 0
            for m in pat.finditer(p):
                if m.end() == m.start():
                    continue
                if m.start() > pos:
                    out.append(p[pos:m.start()])
                out.append(m.group())
                pos = m.end()
            if pos < len(p):
                out.append(p[pos:])
        pieces = out
    return pieces


def test_table_covers_the_converter_names():
    """Every BPE name convert_hf_to_gguf.py's get_vocab_base_pre writes (4227c9be) is known;
    bert-bge*/jina-v2-en are WordPiece models (tokenizer.ggml.model 'bert'), not BPE splits."""
    written = ["chatglm-bpe", "glm4", "minerva-7b", "hunyuan", "hunyuan-dense", "falcon-h1",
               "kimi-k2", "qwen2", "llama-bpe", "deepseek-llm", "deepseek-coder", "falcon",
               "falcon3", "mpt", "starcoder", "gpt-2", "stablelm2", "refact", "command-r", "olmo",
               "dbrx", "jina-v1-en", "jina-v2-es", "jina-v2-de", "smaug-bpe", "poro-chat",
               "jina-v2-code", "viking", "jais", "codeshell", "tekken", "smollm", "bloom",
               "gpt3-finnish", "exaone", "phi-2", "chameleon", "roberta-bpe", "gigachat", "megrez",
               "deepseek-v3", "deepseek-r1-qwen", "gpt-4o", "superbpe", "trillion", "bailingmoe",
               "llama4", "pixtral", "seed-coder", "a.x-4.0", "midm-2.0", "lfm2", "exaone4", "mellum"]
    assert set(written) <= set(gguf_pre.NAMES)
    refused = [n for n in written if isinstance(gguf_pre.lookup(n), str)]
    assert refused == ["kimi-k2", "superbpe"]


@pytest.mark.parametrize("name", gguf_pre.known_names())
def test_split_matches_llama_cpp_semantics(name):
    from tokenizers import pre_tokenizers  # noqa: F401  (the package the loader uses)
    regexes, _, _ = gguf_pre.lookup(name)
    pre = gguf_pre.pre_tokenizer(regexes, byte_level=False)
    for s in SAMPLES:
        got = [p for p, _ in pre.pre_tokenize_str(s)]
        assert got == reference_split(regexes, s), (name, s)
        assert "".join(got) == s


@pytest.mark.parametrize("name", ["kimi-k2", "superbpe", "no-such-split"])
def test_unrebuildable_names_say_the_fix(name):
    why = gguf_pre.lookup(name)
    assert isinstance(why, str) and "--tokenizer DIR" in why and name in why


def test_flags_follow_llama_cpp():
    assert gguf_pre.lookup("llama-bpe")[1:] == (True, True)    # ignore_merges, add_bos
    assert gguf_pre.lookup("smollm")[1:] == (False, False)
    assert gguf_pre.lookup("smollm")[0][0] == r"\p{N}"          # digits split one by one
    assert gguf_pre.lookup(None) == gguf_pre.lookup("default")
