"""One encoder and one typed decoder per contract, reused on every hop."""

from __future__ import annotations

import msgspec

from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.response import ResponseChunk

_encoder = msgspec.json.Encoder()
encode = _encoder.encode

decode_admitted = msgspec.json.Decoder(Admitted).decode
decode_routed = msgspec.json.Decoder(Routed).decode
decode_chunk = msgspec.json.Decoder(ResponseChunk).decode
