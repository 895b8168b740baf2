#!/usr/bin/env bash
# Run on the GPU machine at the start of every device call. Each call carries one part
# (carry: ["gpu_wheels/p1"], then ["gpu_wheels/p2"]); once both parts are in /tmp/parts (the machine
# stays the same while calls follow within 30 s) they are unpacked into /tmp/site.
cd "$(dirname "$0")/.."
mkdir -p /tmp/parts /tmp/site
for f in gpu_wheels/p*/site.part*; do [ -f "$f" ] && [ ! -f "/tmp/parts/$(basename "$f")" ] && cp "$f" /tmp/parts/; done
ls /tmp/parts
if [ ! -f /tmp/site/.ok ] && [ "$(ls /tmp/parts | wc -l)" -ge 2 ]; then
  cat /tmp/parts/site.part* | xz -dc -T0 | tar -x -C /tmp/site && touch /tmp/site/.ok && echo "unpacked /tmp/site"
fi
[ -f /tmp/site/.ok ]
