#!/bin/sh
# hatcheryd only assembles (issue 33, docs/contributing.md): its sources
# stay within a line budget, so product glue that creeps in is caught by
# `make lint` rather than by a reviewer a year later.
set -eu
limit=1200
lines=$(cat crates/hatcheryd/src/*.rs | wc -l)
if [ "$lines" -gt "$limit" ]; then
    echo "crates/hatcheryd/src is $lines lines, over its $limit-line budget: move product glue into the product's crate (docs/contributing.md)" >&2
    exit 1
fi
