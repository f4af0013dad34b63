"""``python -m ringo_trio.server``: the same as the ``ringod`` console script."""

from .main import main

if __name__ == "__main__":
    main()
