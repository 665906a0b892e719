"""The ``edgepack`` command line: thin commands over the public API (``edgepack.compile``, ...)."""
