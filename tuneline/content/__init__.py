"""Content addressing: fingerprints of files and values (file hashes remembered by path, size and mtime), and
step results stored under them, complete or absent."""
