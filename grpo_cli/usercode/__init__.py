"""Code a recipe names (`module:attr`, `path/file.py:attr`) and the killable children it runs in."""
