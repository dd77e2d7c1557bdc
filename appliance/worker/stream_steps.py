"""A streaming model's streams as the worker loop drives them: started, stepped, ended.

streams.py runs the model's generators; this sends what each step brought,
each part as it comes and the end (or the error) once a stream stops, and
ends the streams a cancel or a client's death leaves without a reader.
"""

from __future__ import annotations

from appliance.core.descriptor import Kind
from appliance.core.metadata import ModelMetadata
from appliance.core.status import Counter
from appliance.errors import ApplianceError
from appliance.worker import refusals
from appliance.worker.own_slot import OwnSlot
from appliance.worker.pending import Pending
from appliance.worker.replies import Replies
from appliance.worker.streams import Stream, Streams


class StreamSteps:
    """Start, step and end the streams of one model instance, answering their requests.

    Args:
        streams: the instance's open streams.
        replies: where their parts, ends and errors go.
        own: this instance's status slot, which counts a stream's success.
        metadata: the model's, whose name its errors carry.
    """

    def __init__(
        self, streams: Streams, replies: Replies, own: OwnSlot, metadata: ModelMetadata
    ) -> None:
        self.streams = streams
        self.replies = replies
        self.own = own
        self.metadata = metadata

    def start(self, pending: Pending) -> None:
        """Open the stream ``pending`` asks for; a model that refuses it fails the request."""
        try:
            self.streams.start(pending)
        except Exception as ex:
            self.replies.fail_pending(pending, refusals.as_error(self.metadata.name, ex))

    def step(self) -> None:
        """Take one part of every open stream not paused and send it, or end the stream."""
        if not self.streams.running:
            return
        for stream, step in self.streams.step():
            if step is None or isinstance(step, Exception):
                self.end(
                    stream, None if step is None else refusals.as_error(self.metadata.name, step)
                )
            else:
                self.replies.reply(stream.pending, Kind.PART, step, finished=False)

    def end(self, stream: Stream, error: ApplianceError | None) -> None:
        """Close ``stream``; its request ends with its END, or with ``error``."""
        self.streams.close(stream)
        pending = stream.pending
        if error is None:
            self.replies.reply(pending, Kind.END, {})
            self.own.count(Counter.SUCCESS)
        else:
            self.replies.fail_pending(pending, error, kind=Kind.END)
