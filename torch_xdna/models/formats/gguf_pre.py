"""llama.cpp's BPE pre-tokenizers by `tokenizer.ggml.pre` name, as data, for rebuilding a GGUF
file's tokenizer with the `tokenizers` package.

Why a table: convert_hf_to_gguf.py (get_vocab_base_pre) writes only a *name* for the
pre-tokenizer split; the split rules live in llama.cpp's loader. The names, their flags and each
type's regex list are taken from llama.cpp's src/llama-vocab.cpp (llama_vocab::impl::load and the
llm_tokenizer_bpe constructor) at commit 4227c9be4268ac844921b90f31595f81236bd317 (the copy
vendored in the PyPI sdist llama-cpp-python 0.3.16), extracted mechanically. Where llama.cpp
rewrote a model's regex for std::regex and kept the original from tokenizer.json in a comment,
the original is used (it is what the `tokenizers` package runs for the HF model).

Semantics (unicode.cpp unicode_regex_split): each regex of a type in turn splits every piece
further, matches and the text between them both kept as pieces, which is a `tokenizers`
Split(behavior="isolated") per regex, followed by the byte-level mapping.
"""
from __future__ import annotations

from typing import Any

COMMIT = "4227c9be4268ac844921b90f31595f81236bd317"
# split type -> regexes, applied in order (llm_tokenizer_bpe::llm_tokenizer_bpe)
SPLITS: dict[str, tuple[str, ...]] = {
    'bailingmoe': (  # tokenizer.json
        "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ),
    'bloom': (  # llama.cpp
        ' ?[^(\\s|.,!?…。，、।۔،)]+',
    ),
    'chameleon': (  # llama.cpp
        '<sentinel:[0-9]+>',
        '(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z',
        '([\\t\\n]|    |  )',
        '\\p{N}',
        '[\\p{P}!-/:-@\\[-`{-~]',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'chatglm4': (  # llama.cpp
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    'codeshell': (  # llama.cpp
        '\\p{N}',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'command_r': (  # llama.cpp
        '\\p{N}',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'dbrx': (  # llama.cpp
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    'deepseek3_llm': (  # llama.cpp
        '\\p{N}{1,3}',
        '[一-龥\u3040-ゟ゠-ヿ]+',
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+',
    ),
    'deepseek_coder': (  # llama.cpp
        '[\r\n]',
        '\\s?\\p{L}+',
        '\\s?\\p{P}+',
        '[一-龥ࠀ-一가-\ud7ff]+',
        '\\p{N}',
    ),
    'deepseek_llm': (  # llama.cpp
        '[\r\n]',
        '\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+',
        '\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+',
        '\\s+$',
        '[一-龥ࠀ-一가-\ud7ff]+',
        '\\p{N}+',
    ),
    'default': (  # llama.cpp
        '[\\p{P}\\$\\+<=>\\^~\\|]+',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        '\\p{N}+',
        '[0-9][0-9][0-9]',
    ),
    'exaone': (  # llama.cpp
        '\\p{N}',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'falcon': (  # llama.cpp
        '[\\p{P}\\$\\+<=>\\^~\\|`]+',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        '[0-9][0-9][0-9]',
    ),
    'gpt2': (  # llama.cpp
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'gpt3_finnish': (  # llama.cpp
        ' ?[^(\\s|.,!?…。，、।۔،)]+',
    ),
    'gpt4o': (  # tokenizer.json
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    'hunyuan': (  # tokenizer.json
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    'hunyuan_dense': (  # llama.cpp
        '\\p{N}{1,3}',
        '[一-龥\u3040-ゟ゠-ヿ]+',
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+',
    ),
    'jais': (  # llama.cpp
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'llama3': (  # tokenizer.json
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    'minerva': (  # llama.cpp
        '\\p{N}',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'mpt': (  # llama.cpp
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'olmo': (  # llama.cpp
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'poro': (  # llama.cpp
        ' ?[^(\\s|.,!?…。，、।۔،)]+',
    ),
    'qwen2': (  # tokenizer.json
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    'refact': (  # llama.cpp
        '\\p{N}',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'seed_coder': (  # tokenizer.json
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\r\n]+|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ),
    'smaug': (  # llama.cpp
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    'smollm': (  # llama.cpp
        '\\p{N}',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'stablelm2': (  # tokenizer.json
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    'starcoder': (  # llama.cpp
        '\\p{N}',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'tekken': (  # tokenizer.json
        '[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',
    ),
    'trillion': (  # llama.cpp
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    'viking': (  # llama.cpp
        ' ?[^(\\s|.,!?…。，、।۔،)]+',
        '\\p{N}',
    ),
}
REFUSED: dict[str, str] = {
    'kimi_k2': 'llama.cpp splits it with a custom Han-aware handler (unicode.cpp), not a regex',
    'superbpe': 'its second split is a zero-width lookahead, which a regex Split cannot express',
}
# name -> (split type, ignore_merges, add_bos default), llama_vocab::impl::load
NAMES: dict[str, tuple[str, bool, bool]] = {
    'default': ('default', False, False),
    'llama3': ('llama3', True, True),
    'llama-v3': ('llama3', True, True),
    'llama-bpe': ('llama3', True, True),
    'falcon3': ('llama3', True, True),
    'falcon-h1': ('llama3', True, True),
    'pixtral': ('llama3', True, True),
    'midm-2.0': ('llama3', True, True),
    'lfm2': ('llama3', True, True),
    'deepseek-llm': ('deepseek_llm', False, False),
    'deepseek-coder': ('deepseek_coder', False, False),
    'deepseek-v3': ('deepseek3_llm', False, False),
    'falcon': ('falcon', False, False),
    'mpt': ('mpt', False, False),
    'starcoder': ('starcoder', False, False),
    'gpt-2': ('gpt2', False, False),
    'phi-2': ('gpt2', False, False),
    'jina-es': ('gpt2', False, False),
    'jina-de': ('gpt2', False, False),
    'gigachat': ('gpt2', False, False),
    'jina-v2-es': ('gpt2', False, False),
    'jina-v2-de': ('gpt2', False, False),
    'a.x-4.0': ('gpt2', False, False),
    'mellum': ('gpt2', False, False),
    'jina-v1-en': ('gpt2', False, False),
    'jina-v2-code': ('gpt2', False, False),
    'roberta-bpe': ('gpt2', False, False),
    'refact': ('refact', False, False),
    'command-r': ('command_r', False, False),
    'qwen2': ('qwen2', False, False),
    'deepseek-r1-qwen': ('qwen2', False, False),
    'stablelm2': ('stablelm2', False, False),
    'olmo': ('olmo', False, False),
    'dbrx': ('dbrx', False, False),
    'smaug-bpe': ('smaug', False, False),
    'poro-chat': ('poro', False, False),
    'glm4': ('chatglm4', False, False),
    'chatglm-bpe': ('chatglm4', False, False),
    'viking': ('viking', False, False),
    'jais': ('jais', False, False),
    'tekken': ('tekken', True, True),
    'smollm': ('smollm', False, False),
    'codeshell': ('codeshell', False, False),
    'bloom': ('bloom', False, False),
    'gpt3-finnish': ('gpt3_finnish', False, False),
    'exaone': ('exaone', False, False),
    'exaone4': ('gpt2', False, False),
    'chameleon': ('chameleon', False, True),
    'minerva-7b': ('minerva', False, False),
    'megrez': ('qwen2', False, False),
    'gpt-4o': ('gpt4o', False, False),
    'llama4': ('gpt4o', False, False),
    'superbpe': ('superbpe', False, False),
    'trillion': ('trillion', False, False),
    'bailingmoe': ('bailingmoe', False, False),
    'seed-coder': ('seed_coder', False, False),
    'hunyuan': ('hunyuan', False, False),
    'hunyuan-dense': ('hunyuan_dense', False, False),
    'kimi-k2': ('kimi_k2', False, False),
}


GPT2_ALIASES = {"gpt2": "gpt-2"}           # older files wrote "gpt2"; llama.cpp knows "gpt-2"


def known_names() -> list[str]:
    """Every pre-tokenizer name this table rebuilds."""
    return sorted(n for n, (t, _, _) in NAMES.items() if t in SPLITS) + sorted(GPT2_ALIASES)


def lookup(name: str | None) -> tuple[tuple[str, ...], bool, bool] | str:
    """(regexes, ignore_merges, add_bos default) of a pre-tokenizer name, or why it cannot be
    rebuilt (a string naming the fix). A missing name is llama.cpp's 'default'."""
    name = GPT2_ALIASES.get(name or "default", name or "default")
    if name not in NAMES:
        return (f"tokenizer.ggml.pre {name!r} is not a pre-tokenizer llama.cpp knows (this table: "
                f"llama.cpp {COMMIT[:12]}); pass --tokenizer DIR with the original tokenizer.json")
    kind, ignore_merges, add_bos = NAMES[name]
    if kind in REFUSED:
        return (f"tokenizer.ggml.pre {name!r} cannot be rebuilt here ({REFUSED[kind]}); pass "
                "--tokenizer DIR with the original tokenizer.json")
    return SPLITS[kind], ignore_merges, add_bos


def pre_tokenizer(regexes: tuple[str, ...], byte_level: bool = True) -> Any:
    """A `tokenizers` pre-tokenizer: one isolated Split per regex, then the byte-level map."""
    from tokenizers import Regex, pre_tokenizers
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    if byte_level:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)
