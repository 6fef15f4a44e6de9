"""Offline evaluation of trained VLMs (``loong eval vqa``)."""
