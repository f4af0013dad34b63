SDK_NAME = "ringo-trio"
SDK_VERSION = "0.1.0"
__version__ = SDK_VERSION
