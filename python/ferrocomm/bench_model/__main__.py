import sys

from . import _entry

sys.exit(_entry())
