"""Object storage: the log store that reads and writes ``_delta_log``, Arrow filesystems, connector options
and the secrets among them."""
