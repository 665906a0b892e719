"""Deployable output: the no-Python C bundle (``packaging.c``) and the Android AAR (``packaging.android``)."""
