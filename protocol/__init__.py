"""The contract between the driver and the workers: DataProto and the dispatch modes."""

from protocol.data_proto import DataProto, DataProtoItem, pad_dataproto_to_divisor, unpad_dataproto
from protocol.dispatch import Dispatch, collect_from_ranks, dispatch_to_ranks, get_registration, register

__all__ = [
    "DataProto",
    "DataProtoItem",
    "Dispatch",
    "collect_from_ranks",
    "dispatch_to_ranks",
    "get_registration",
    "pad_dataproto_to_divisor",
    "register",
    "unpad_dataproto",
]
