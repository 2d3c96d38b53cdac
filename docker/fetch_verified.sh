#!/bin/bash
# fetch_verified.sh URL DEST [SHA256]: download URL to DEST (retries, timeouts) and check its SHA-256.
# With an empty SHA256 the archive's digest is printed and recorded in DEST.sha256 instead: only for
# archives whose publisher gives no checksum for a pinned version (see toolchain.Dockerfile).
set -euo pipefail
url=$1 dest=$2 want=${3:-}
curl --fail --silent --show-error --location --retry 3 --connect-timeout 30 --max-time 900 \
  --proto '=https' --tlsv1.2 --output "$dest" "$url"
have=$(sha256sum "$dest" | cut -d' ' -f1)
if [ -n "$want" ]; then
  if [ "$have" != "$want" ]; then
    echo "checksum mismatch for $url: got $have, expected $want" >&2
    exit 1
  fi
  echo "verified $url ($have)"
else
  echo "UNVERIFIED (no checksum pinned) $url: sha256 $have"
fi
echo "$have  $(basename "$dest")" > "$dest.sha256"
