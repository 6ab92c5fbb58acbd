"""The package version, as installed."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("switchboard")
except PackageNotFoundError:  # running from a checkout without installing
    VERSION = "0.0.0+checkout"
