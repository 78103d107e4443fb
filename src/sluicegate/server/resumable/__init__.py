"""Resumable streams: their producers, their logs' readers, resume and cancel."""
