"""Uncased WordPiece tokenisation for pretraining, built on the `tokenizers` library.

Why a wrapper rather than a bare `tokenizers.Tokenizer`: the data pipeline and the model need
the ids of the five special tokens, a post-processor that lays out `[CLS] A [SEP] B [SEP]`
with segment ids, a way to save both the fast `tokenizer.json` and the portable BERT
`vocab.txt`, and a fingerprint that ties a tokenised-data cache or a checkpoint to the exact
vocabulary it was made with. `FolnetTokenizer` provides exactly those and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from folnet.atomic_write import atomic_write, atomic_write_text
from folnet.errors import FolnetError, choices
from folnet.read_files import parse_json
from folnet.train.data.alphabet import bounded_alphabet
from folnet.train.data.tokenizer_inputs import (
    SENTINEL_TOKEN,
    SPECIAL_TOKENS,
    chain_files,
    training_inputs,
)

__all__ = ["SPECIAL_TOKENS", "FolnetTokenizer", "load_tokenizer", "train_tokenizer"]

_PAD, _UNK, _CLS, _SEP, _MASK = SPECIAL_TOKENS
_PREFIX = "##"  # WordPiece continuing-subword prefix, as in BERT


def _missing_specials(tokenizer: Tokenizer) -> list[str]:
    return [tok for tok in SPECIAL_TOKENS if tokenizer.token_to_id(tok) is None]


def _special_id(token: str) -> property:
    """A read-only property: the id of the special ``token``."""
    return property(lambda self: self._ids[token], doc=f"The id of {token}.")


class FolnetTokenizer:
    """A `tokenizers.Tokenizer` with BERT special tokens, pair layout and a fingerprint.

    The wrapped tokenizer gets a BERT post-processor on construction, so
    `tok.tokenizer.encode(a, b)` yields `[CLS] a [SEP] b [SEP]` with type ids 0...0 1...1.
    `encode` here returns bare ids (no specials): the pretraining pipeline assembles segment
    pairs itself from whole sentences.
    """

    def __init__(self, tokenizer: Tokenizer, *, source: str = "<memory>",
                 model_max_length: int = 512) -> None:
        missing = _missing_specials(tokenizer)
        if missing:
            raise FolnetError(
                f"tokenizer {source!r} lacks the special token(s) {choices(missing)}; "
                f"a folnet tokenizer needs all of {choices(SPECIAL_TOKENS)}"
            )
        self._tok = tokenizer
        self._ids = {name: int(tokenizer.token_to_id(name)) for name in SPECIAL_TOKENS}
        # Explicit type ids: a freshly trained WordPiece has no post-processor at all. A
        # byte-level BPE (`folnet.train.data.bpe`, the tokenizer for generation) adds no
        # special token to a single text: a decoder's prompt is the text itself.
        bert = self.wordpiece
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{_CLS}:0 $A:0 {_SEP}:0" if bert else "$A:0",
            pair=f"{_CLS}:0 $A:0 {_SEP}:0 $B:1 {_SEP}:1" if bert else f"$A:0 {_SEP}:0 $B:1",
            special_tokens=[(_CLS, self._ids[_CLS]), (_SEP, self._ids[_SEP])],
        )
        self._fingerprint: str | None = None
        # the longest input the model was trained on (tokenizer_config.json says it)
        self.model_max_length = int(model_max_length)

    # -- special ids -------------------------------------------------------------------------
    pad_id = _special_id(_PAD)
    unk_id = _special_id(_UNK)
    cls_id = _special_id(_CLS)
    sep_id = _special_id(_SEP)
    mask_id = _special_id(_MASK)

    @property
    def wordpiece(self) -> bool:
        """Whether this is a WordPiece vocabulary (BERT's), not a byte-level BPE."""
        return json.loads(self._tok.to_str())["model"]["type"] == "WordPiece"

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids that masking must never choose and never sample as a random replacement."""
        return frozenset(self._ids.values())

    @property
    def sentinel_ids(self) -> list[int]:
        """The ids of the span sentinels ``<extra_id_0>``, ``<extra_id_1>``, ... the
        vocabulary holds (T5's extra ids; none unless `with_sentinels` added them)."""
        found: list[int] = []
        while (i := self._tok.token_to_id(SENTINEL_TOKEN.format(len(found)))) is not None:
            found.append(int(i))
        return found

    def with_sentinels(self, count: int) -> FolnetTokenizer:
        """This vocabulary with ``count`` span sentinels (special tokens: never split out of
        text, dropped by ``decode(skip_special_tokens=True)``), added after its tokens where
        missing; ``self`` when it has them all. An encoder-decoder's pretraining needs them
        (`folnet.train.data.span_rows`)."""
        have = len(self.sentinel_ids)
        if have >= count:
            return self
        tokenizer = Tokenizer.from_str(self._tok.to_str())
        tokenizer.add_special_tokens([AddedToken(SENTINEL_TOKEN.format(i), special=True)
                                      for i in range(have, count)])
        return FolnetTokenizer(tokenizer, model_max_length=self.model_max_length)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def tokenizer(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer` (post-processor already set)."""
        return self._tok

    # -- encoding ----------------------------------------------------------------------------
    def encode(self, text: str, *, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, without [CLS]/[SEP].

        By default a literal "[SEP]" or "[MASK]" in the text is tokenised as ordinary
        characters, so corpus text can never inject control tokens into an example's layout;
        `parse_special=True` maps them to their ids (e.g. for a fill-in-the-blank prompt).
        """
        return self.encode_batch([text], parse_special=parse_special)[0]

    def encode_batch(self, texts: Sequence[str], *, parse_special: bool = False) -> list[list[int]]:
        """`encode` for many texts at once (parallel in Rust); the corpus builder uses this."""
        if not texts:
            return []
        previous = self._tok.encode_special_tokens
        self._tok.encode_special_tokens = not parse_special
        try:
            # encode_batch_fast (tokenizers >= 0.20) skips character offsets we never use.
            encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
            encodings = encode(list(texts), add_special_tokens=False)
        finally:
            self._tok.encode_special_tokens = previous
        return [list(enc.ids) for enc in encodings]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text for `ids`; special tokens are shown unless `skip_special_tokens`."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._tok.id_to_token(int(i)) or _UNK for i in ids]

    # -- persistence -------------------------------------------------------------------------
    def vocab(self) -> list[str]:
        """Tokens ordered by id; raises FolnetError if the ids are not contiguous from 0."""
        by_id = {i: t for t, i in self._tok.get_vocab(with_added_tokens=True).items()}
        if sorted(by_id) != list(range(len(by_id))):
            raise FolnetError("tokenizer vocabulary ids are not contiguous from 0")
        return [by_id[i] for i in range(len(by_id))]

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write `tokenizer.json`, `vocab.txt`, `tokenizer_config.json` and
        `special_tokens_map.json` into `directory` (created); return it.

        `vocab.txt` is the portable BERT format; `tokenizer.json` additionally keeps the
        normaliser settings (lowercasing) and the `[CLS] A [SEP] B [SEP]` post-processor, so
        prefer it when both are present. The two config files let `transformers.AutoTokenizer`
        load the directory with its special tokens (pad, unk, cls, sep, mask) and
        `model_max_length`, so its collators pad batches the model reads directly.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # each file atomically: another process (a DDP rank, a from_pretrained) that reads the
        # directory while it is rewritten sees the old file or the new one, never half of one
        atomic_write(directory / "tokenizer.json", lambda tmp: self._tok.save(str(tmp)))
        if self.wordpiece:  # BERT's portable format; a BPE has merges too (tokenizer.json)
            atomic_write_text(directory / "vocab.txt",
                              "".join(tok + "\n" for tok in self.vocab()))
        specials = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
                            SPECIAL_TOKENS, strict=True))
        if not self.wordpiece:  # generation's start and end: [CLS] and [SEP]
            specials.update(bos_token=_CLS, eos_token=_SEP)
        if sentinels := self.sentinel_ids:  # span corruption's (T5's extra ids)
            specials["additional_special_tokens"] = [SENTINEL_TOKEN.format(i)
                                                     for i in range(len(sentinels))]
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials,
                  "model_max_length": self.model_max_length, "padding_side": "right",
                  "truncation_side": "right", "clean_up_tokenization_spaces": False,
                  "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}
        for name, payload in (("tokenizer_config.json", config),
                              ("special_tokens_map.json", specials)):
            atomic_write_text(directory / name, json.dumps(payload, indent=2) + "\n")
        return directory

    @property
    def fingerprint(self) -> str:
        """A stable 16-hex-digit hash of the vocabulary and normalisation config.

        Only what changes the ids a text maps to is hashed (vocab in id order, model
        settings, normaliser, pre-tokeniser), so the same vocabulary loaded from
        `tokenizer.json` or from `vocab.txt` has the same fingerprint.
        """
        if self._fingerprint is None:
            config = json.loads(self._tok.to_str())
            model = dict(config.get("model") or {})
            model.pop("vocab", None)
            canonical = {
                "vocab": self.vocab(),
                "model": {k: model.get(k) for k in ("type", "unk_token", _PREFIX_KEY)},
                "normalizer": config.get("normalizer"),
                "pre_tokenizer": config.get("pre_tokenizer"),
            }
            blob = json.dumps(canonical, sort_keys=True, ensure_ascii=True).encode()
            self._fingerprint = hashlib.sha256(blob).hexdigest()[:16]
        return self._fingerprint

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"FolnetTokenizer(vocab_size={self.vocab_size}, fingerprint={self.fingerprint!r})"


_PREFIX_KEY = "continuing_subword_prefix"


def _bert_pipeline(tokenizer: Tokenizer, lowercase: bool) -> Tokenizer:
    """Attach the BERT normaliser, pre-tokeniser and WordPiece decoder."""
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=_PREFIX)
    return tokenizer


def train_tokenizer(
    files: Sequence[str | os.PathLike[str]] | None = None,
    *,
    texts: Iterable[str] | Callable[[], Iterable[str]] | None = None,
    vocab_size: int = 32768,
    min_frequency: int = 2,
    lowercase: bool = True,
    show_progress: bool = False,
    encoding: str = "utf-8",
) -> FolnetTokenizer:
    """Train a BERT-style WordPiece tokenizer on text files (decoded with `encoding`; a byte
    that does not decode is an error naming the file and line) and/or texts; the same input
    always gives the same vocabulary, of at most `vocab_size` entries.

    Special tokens come first, so [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.

    Why two passes over the input: the `tokenizers` WordPiece trainer numbers the continuing
    pieces (``##a``, ``##b``, ...) in hash-map order and breaks ties between equally frequent
    merges by those numbers, so two trainings on the same text differ
    (huggingface/tokenizers#1794). A first pass counts the characters and numbers every
    continuing piece in sorted order before training. ``texts`` may therefore be a
    zero-argument callable that yields the texts afresh on each call (for corpora too large to
    hold); a one-shot iterator is read into a list.

    The alphabet is bounded too (`folnet.train.data.alphabet`): only the most frequent
    characters that fit in `vocab_size` are kept, with a warning when some are left out.
    """
    paths, make_texts = training_inputs(files, texts, vocab_size, min_frequency)

    def stream() -> Iterable[str]:
        return chain_files(paths, make_texts(), encoding)

    tokenizer = _bert_pipeline(Tokenizer(models.WordPiece(unk_token=_UNK)), lowercase)
    alphabet = bounded_alphabet(tokenizer.normalizer.normalize_str, stream(),
                                vocab_size, len(SPECIAL_TOKENS))
    pieces = [_PREFIX + c for c in alphabet]
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=show_progress,
        special_tokens=[*SPECIAL_TOKENS, *pieces],  # numbered first, in this order
        continuing_subword_prefix=_PREFIX,
        # exactly these characters: an initial character outranks any seen one, and the
        # limit drops every other
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
    )
    tokenizer.train_from_iterator(stream(), trainer)
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS) + len(pieces):
        raise FolnetError("tokenizer training saw no text: the training corpus is empty")
    # the pieces were registered as special tokens only to fix their ids: rebuild the model
    # from the vocabulary so that they are ordinary word pieces
    model = models.WordPiece(vocab=tokenizer.get_vocab(), unk_token=_UNK,
                             continuing_subword_prefix=_PREFIX)
    trained = _bert_pipeline(Tokenizer(model), lowercase)
    trained.add_special_tokens(list(SPECIAL_TOKENS))
    if trained.get_vocab_size() > vocab_size:  # the bound above makes this impossible
        raise FolnetError(f"the trained vocabulary has {trained.get_vocab_size()} entries, "
                          f"more than vocab_size {vocab_size}; please report this")
    return FolnetTokenizer(trained, source="<trained>")


def _infer_lowercase(vocab: Iterable[str]) -> bool:
    """An uncased vocabulary has no upper-case letters outside the special tokens."""
    specials = set(SPECIAL_TOKENS)
    return not any(
        tok not in specials and not tok.startswith("[") and tok != tok.lower() for tok in vocab
    )


def _from_vocab_txt(path: Path, lowercase: bool | None) -> Tokenizer:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise FolnetError(f"cannot read vocabulary file {str(path)!r}: {exc}") from None
    vocab: dict[str, int] = {}
    for line in lines:
        token = line.rstrip("\r\n")
        if token and token not in vocab:
            vocab[token] = len(vocab)
    if not vocab:
        raise FolnetError(f"vocabulary file {str(path)!r} is empty")
    missing = [tok for tok in SPECIAL_TOKENS if tok not in vocab]
    if missing:
        raise FolnetError(
            f"vocabulary file {str(path)!r} lacks the special token(s) {choices(missing)}"
        )
    if lowercase is None:
        lowercase = _infer_lowercase(vocab)
    model = models.WordPiece(vocab=vocab, unk_token=_UNK, continuing_subword_prefix=_PREFIX)
    return _bert_pipeline(Tokenizer(model), lowercase)


def load_tokenizer(
    path: str | os.PathLike[str], *, lowercase: bool | None = None
) -> FolnetTokenizer:
    """Load a `tokenizer.json`, a BERT `vocab.txt`, or a directory holding either.

    A directory with both uses `tokenizer.json`. For `vocab.txt`, `lowercase=None` infers
    casing from the vocabulary (no upper-case token means uncased); pass a bool to override.
    """
    path = Path(path)
    if path.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise FolnetError(
                f"tokenizer directory {str(path)!r} contains neither tokenizer.json nor vocab.txt"
            )
    if not path.is_file():
        raise FolnetError(f"tokenizer file {str(path)!r} does not exist")
    if path.suffix == ".txt":
        return FolnetTokenizer(_from_vocab_txt(path, lowercase), source=str(path))
    if path.suffix != ".json":
        raise FolnetError(
            f"tokenizer file {str(path)!r} has unknown type {path.suffix!r}; "
            f"expected {choices(['.json', '.txt'])}"
        )
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise FolnetError(f"cannot read tokenizer file {str(path)!r}: {exc}") from None
    missing = _missing_specials(tokenizer)
    if missing:
        raise FolnetError(
            f"tokenizer file {str(path)!r} lacks the special token(s) {choices(missing)}"
        )
    if lowercase is not None:
        _bert_pipeline(tokenizer, lowercase)
    length = 512
    config = path.parent / "tokenizer_config.json"
    if config.is_file():
        try:
            length = int(parse_json(config.read_text(encoding="utf-8"),
                                    str(config))["model_max_length"])
        except FolnetError:  # nested too deeply: a ValueError too, but says so itself
            raise
        except (ValueError, KeyError, TypeError):
            raise FolnetError(f"{config}: no integer model_max_length") from None
    return FolnetTokenizer(tokenizer, source=str(path), model_max_length=length)
