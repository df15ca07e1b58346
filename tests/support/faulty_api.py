"""The emulated API server answering chosen requests with an error, as a cluster can: an admission
webhook refusing a patch, a validation failure, a struggling etcd."""

from __future__ import annotations

import re

import aiohttp.web

from kneecap.demo.kubeapi import KubeAPI


class FaultyAPI(KubeAPI):
    """The emulated API server, answering chosen requests with an error (as an admission webhook,
    a validation failure or a struggling etcd would). ``FAULTS``: (method, path regex, body
    substring or None) -> [HTTP status, message, how many more times (None: always)]; a rule
    ``arm`` ({...: rule}) is added once a request matches its key (a fault that follows an event)."""

    FAULTS: dict = {}
    ARM: dict = {}

    async def __call__(self, raw_request):
        body = (await raw_request.text()) if raw_request.can_read_body else ""
        for table in (FaultyAPI.ARM, FaultyAPI.FAULTS):
            for key in list(table):
                method, pattern, needle = key
                if raw_request.method != method or not re.search(pattern, raw_request.path):
                    continue
                if needle is not None and needle not in body:
                    continue
                if table is FaultyAPI.ARM:
                    FaultyAPI.FAULTS.update(table.pop(key))
                    continue
                code, message, left = table[key]
                if left is not None:
                    table[key][2] = left - 1
                    if left - 1 <= 0:
                        del table[key]
                return aiohttp.web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                  "message": message, "code": code}, status=code)
        return await super().__call__(raw_request)
