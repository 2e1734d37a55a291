"""Speculative decoding: a drafter proposes tokens, the main model checks them all in one
batch and keeps those it agrees with.

  drafters.py    who proposes: a small draft model, or prompt lookup
  verify.py      one round: draft, verify in one batch, keep the agreeing prefix
  controller.py  draft length and on/off from measurements; a request's figures
  cut_draft.py   a draft whose output layer keeps only the most used tokens

Which installed model can draft for which is the catalog's (catalog/drafts.py).
"""
