"""Outputs read by URL: the manifest and tar shards streamed, checked, and cached."""
