"""The demo, and the fake Messages API it and the tests talk to.

What the rest of the program may use from this folder."""

