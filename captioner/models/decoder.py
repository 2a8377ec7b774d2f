"""Former home of the LSTM decoder, kept so that older imports keep working: the decoders now live in
captioner/models/decoders/ (the contract, the Show-Attend-Tell reference and its fast path, the Transformer).
``ShowAttendTellDecoder`` is the plain reference; models build ``FastShowAttendTellDecoder`` (DECODERS["lstm"])."""
from captioner.models.decoders import (GATES, DecoderOutput, FastShowAttendTellDecoder, ProjectedState,  # noqa: F401
                                       SampleOutput, ShowAttendTellDecoder)
