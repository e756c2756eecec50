"""One session, written: the writer, its log file, index, manifest, cap, publisher, deriver,
recovery and locks."""
