#!/usr/bin/env bash
# Run on the GPU machine at the start of every device call. Each call carries one part of a packed set
# (gpu_wheels/pN/NAME.partIIofNN: `site` from gpu_pack.sh = vLLM and what our engine imports, `serve` from
# gpu_pack_serve.sh = the app's serving stack and Ray Serve, `peers` from gpu_pack_peers.sh); the machine
# stays the same while calls follow within 30 s, so parts gather in /tmp/parts, and a set whose parts are
# all there is unpacked once: site and serve into /tmp/site, peers into /tmp/peers.
# Succeeds once /tmp/site (vLLM) is ready; `gpu_setup.sh serve` (or peers) also needs that set.
cd "$(dirname "$0")/.."
mkdir -p /tmp/parts /tmp/site /tmp/peers
for f in gpu_wheels/p*/*.part*of*; do
  [ -f "$f" ] && [ ! -f "/tmp/parts/$(basename "$f")" ] && cp "$f" /tmp/parts/
done
ls /tmp/parts
for first in /tmp/parts/*.part00of*; do
  [ -f "$first" ] || continue
  name=$(basename "${first%%.part00of*}"); total=$((10#${first##*of}))
  [ -f "/tmp/parts/.$name.ok" ] && continue
  [ "$(ls /tmp/parts/$name.part*of* | wc -l)" -ge "$total" ] || continue
  dest=/tmp/site; [ "$name" = peers ] && dest=/tmp/peers
  cat /tmp/parts/$name.part*of* | xz -dc -T0 | tar -x -C $dest && touch "/tmp/parts/.$name.ok" "$dest/.ok" && echo "unpacked $name into $dest"
done
for need in site "$@"; do [ -f "/tmp/parts/.$need.ok" ] || { echo "set $need not complete yet"; exit 1; }; done
