"""Deciding and acting: kopf handlers, reconcile of owned objects, decision policy."""
