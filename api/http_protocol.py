"""uvicorn's httptools protocol with a bound on the request head (request line plus headers).

httptools accepts heads of any size and concatenates them as they arrive (an 8 MB URL and a 20 MB header
were accepted, at a cost growing with the square of their size). Here the bytes of a head are counted as they
arrive, before parsing: past the limit the client gets a 431 and the connection is closed. h11 bounds heads
too, but it is pure Python and under a fast stream it delayed other connections by seconds.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol


def bounded_protocol(max_head_bytes: int) -> type[HttpToolsProtocol]:
    """The protocol class for uvicorn's `http` setting, with its limit."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _head_bytes = 0
        _in_head = True
        _tail = b""  # the last bytes of the head so far: its end may straddle two reads

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                # Only the bytes up to the blank line that ends the head count; a body may follow in the same read.
                joined = self._tail + data
                end = joined.find(b"\r\n\r\n")
                self._head_bytes += len(data) if end == -1 else end + 4 - len(self._tail)
                if self._head_bytes > max_head_bytes:
                    self._refuse_head()
                    return
                self._tail = joined[-3:]
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_head, self._head_bytes, self._tail = True, 0, b""
            super().on_message_complete()

        def _refuse_head(self) -> None:
            message = f"The request line and headers exceed {max_head_bytes} bytes.".encode()
            self.transport.write(b"".join([
                STATUS_LINE[431], b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: " + str(len(message)).encode() + b"\r\n", b"connection: close\r\n\r\n", message,
            ]))
            self.transport.close()

    return BoundedHttpToolsProtocol
