"""s08 context compact: the lesson is code.py; the machinery around it lives in the folders here,
one folder a role. Imported as a package, so that code.py never stands in for the standard
library's `code`."""
