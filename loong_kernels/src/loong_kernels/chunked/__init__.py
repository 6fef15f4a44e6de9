"""Pure-torch kernels that run on every device (``"<op>:chunked"``)."""
