"""The network side: the TCP listener and its connections (``server``,
``connection``), the method table and routes, the tick driver, and TLS.

It speaks the protocol and calls the engine; it holds no task logic.
"""
