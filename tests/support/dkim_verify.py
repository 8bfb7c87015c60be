#!/usr/bin/env python3
"""Verify the DKIM signatures of one message with dkimpy, an independent
implementation, answering its DNS look-ups from records given on the
command line instead of asking DNS.

usage: dkim_verify.py [--no-ed25519] MESSAGE_FILE NAME=TXT_VALUE [NAME=TXT_VALUE ...]

--no-ed25519 plays a verifier that predates RFC 8463: dkimpy with
ed25519-sha256 taken out of its known algorithms, so such a signature fails
as "unknown signature algorithm" and only the others can pass the message.

Prints one JSON object: {"results": [{"ok": bool, "error": str|null,
"d": ..., "s": ..., "a": ..., "h": [...]}, ...], "lookups": [...],
"first_ok": bool (what a verifier that checks only the top signature,
dkimpy's default, says)}. Exit 0 when it could check
(whatever the verdict), 3 when dkimpy (or PyNaCl, for ed25519) is missing.
"""
import json
import sys

try:
    import dkim
    import nacl.signing  # noqa: F401  (dkimpy needs it for ed25519)
except ImportError as e:
    print(f"dkim_verify.py: {e}: run scripts/install-deps.sh "
          "(python3 -m pip install dkimpy pynacl)", file=sys.stderr)
    sys.exit(3)


def main():
    args = sys.argv[1:]
    if args and args[0] == "--no-ed25519":
        args = args[1:]
        dkim.HASH_ALGORITHMS.pop(b"ed25519-sha256", None)
    message = open(args[0], "rb").read()
    records = {}
    for arg in args[1:]:
        name, _, value = arg.partition("=")
        records[name.rstrip(".").lower()] = value.encode()
    lookups = []

    def dnsfunc(name, timeout=5):
        name = name.decode() if isinstance(name, bytes) else name
        lookups.append(name)
        return records.get(name.rstrip(".").lower())

    d = dkim.DKIM(message)
    results = []
    for k in range(len([h for h in d.headers if h[0].lower() == b"dkim-signature"])):
        error = None
        try:
            ok = d.verify(idx=k, dnsfunc=dnsfunc)
        except dkim.DKIMException as e:
            # some failures (a body hash mismatch) are raised, not returned
            ok, error = False, str(e)
        sig = d.signature_fields or {}
        results.append({
            "ok": bool(ok),
            "error": error,
            "d": sig.get(b"d", b"").decode(),
            "s": sig.get(b"s", b"").decode(),
            "a": sig.get(b"a", b"").decode(),
            "h": [h.strip().decode().lower() for h in sig.get(b"h", b"").split(b":") if h.strip()],
        })
    try:
        first_ok = bool(d.verify(dnsfunc=dnsfunc)) if results else False
    except dkim.DKIMException:
        first_ok = False
    print(json.dumps({"results": results, "lookups": lookups, "first_ok": first_ok}))


main()
