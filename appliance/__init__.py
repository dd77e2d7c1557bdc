"""The appliance: a multiprocess, shared-memory model server for five protocols.

Read top-down: ``__main__`` -> ``cli`` -> ``master.supervisor`` (the master)
-> ``frontends`` (the processes that own the wire) -> ``protocols`` (codecs
and routes) -> ``client.api`` (the one internal client API) -> ``core``
(shared memory, descriptors, status) -> ``worker`` (the model process) ->
``model`` (what model authors write against).
"""

__version__ = "0.1.0"

from appliance import native

# Before any module of the request path is imported: compiled only if current.
native.guard()
