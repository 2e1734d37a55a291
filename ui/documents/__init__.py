"""The Documents page (documents_page.py): the user's collections of folders and files,
their indexing progress and the files that could not be read, and adding one."""
