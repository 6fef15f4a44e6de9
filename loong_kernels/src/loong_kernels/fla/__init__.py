"""Backends wrapping flash-linear-attention (``pip install 'loong-kernels[fla]'``): ``"<op>:fla"``."""
