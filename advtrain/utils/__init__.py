"""Shared foundations of the library: errors and the did-you-mean helper,
the registry base, atomic file writes, progress lines and downloads.

Nothing here imports another advtrain package.
"""
