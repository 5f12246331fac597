"""Pretraining data: corpus documents, the tokenizer, NSP/SOP example pairs (cached or
streamed), dynamic MLM masking, and the corpus that needs no download (the generated kinship
world).

* `sources` finds and reads the files of a corpus, `checks` refuses files that are not text;
* `documents` reads text, JSON Lines, parquet or saved datasets as documents of sentences;
* `tokenizer` is the WordPiece tokenizer with BERT's special tokens (`alphabet` bounds it);
* `config` describes how a corpus becomes examples; `pairs` builds the segment pairs;
* `corpus` caches the examples on disk, `streaming` reads corpora larger than memory;
* `masking` draws fresh MLM masks per batch; `kinship` is the embedded corpus.
"""
