"""TensorBoard for tests: a stand-in event log that records its calls (``RecordedEvents``) and a reader of the
scalars in event files independent of the writer (``read_event_scalars``)."""
import os


class RecordedEvents:
    """An event log that keeps each ``scalars`` call as (step, values)."""

    def __init__(self):
        self.calls = []

    def scalars(self, step, values):
        self.calls.append((step, dict(values)))


def read_event_scalars(folder):
    """(tag, step, value) of every scalar in the event files of ``folder``: TFRecord framing (u64 length,
    u32 crc, payload, u32 crc) around Event protobufs, read here independently of the writer."""
    from tensorboardX.proto.event_pb2 import Event

    found = []
    for name in sorted(os.listdir(folder)):
        data = open(os.path.join(folder, name), "rb").read()
        offset = 0
        while offset < len(data):
            length = int.from_bytes(data[offset:offset + 8], "little")
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            found += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return found
