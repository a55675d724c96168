"""What Kopf keeps of the last state it handled: a digest of it, not a copy.

Kopf compares each new state of a resource with the last one it handled, kept in an
annotation, to tell whether something changed. Its own storage keeps the whole spec
there; annotations share 256 KiB on an object, with kubectl's last-applied copy beside
it, and a spec holding an arrival trace (`load.arrival.timestamps`) or CA bundles runs
past that: every patch of the resource's metadata would then be refused, the finalizer
included. The operator has no handler that reads what changed (a daemon runs each
study, a deletion handler cleans up), so a digest tells Kopf all it uses, in a constant
few dozen bytes whatever the spec's size."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import cast

import kopf

DIGEST_KEY = "sha256"


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """Kopf's annotation storage of the last-handled state, keeping a SHA-256 of the
    state Kopf would have stored: a change anywhere in it changes the digest."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        text = json.dumps(essence, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest = hashlib.sha256(text.encode()).hexdigest()
        return cast(kopf.BodyEssence, {DIGEST_KEY: digest})
