"""The kinds of FOLNet model, each a thin variant over the one stack (`folnet.arch.layer.stack`);
importing this package registers them with `folnet.arch.kinds`."""

from folnet.arch.models.base import FolnetBase
from folnet.arch.models.decoder import FolnetDecoderLM
from folnet.arch.models.encdec import FolnetEncoderDecoder
from folnet.arch.models.encoder import FolnetModel

__all__ = ["FolnetBase", "FolnetDecoderLM", "FolnetEncoderDecoder", "FolnetModel"]
