"""A TCP forwarder: listens on a pod's kwok IP and port and relays each connection, bytes
unchanged, to a server elsewhere on loopback (as a port-forward does), so a process that serves
on 127.0.0.1 (the session's vLLM) answers at the pod's own address."""

from __future__ import annotations

import socket
import threading


class Forwarder:
    def __init__(self, host: str, port: int, target: tuple[str, int]):
        self.target = target
        self.connections = 0
        self.listener = socket.create_server((host, port))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(self.target, timeout=30)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()
