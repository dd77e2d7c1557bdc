"""The appliance's errors mapped onto MIP's six error subtypes.

SPEC: specs/mip.md "Errors" and PROTOCOL-FACTS §4.1. MIP's codes are coarse;
the frame's payload carries the appliance's message (UTF-8) so a user can
still see which model, tensor, limit and value were at fault:

=====================  ========  =============================================
appliance error        subtype   why
=====================  ========  =============================================
BadRequest             SHAPE     the items do not fit the model's inputs
Unsupported            METHOD    the model does not implement what was asked
TooLarge, Overloaded   MEMORY    a size limit, or a full queue or ring
everything else        INTERNAL  the model failed or could not run
=====================  ========  =============================================
"""

from __future__ import annotations

from appliance.errors import ApplianceError, BadRequest, Overloaded, TooLarge, Unsupported
from appliance.protocols.mip.codec import ErrorCode, MipError

# Checked in order, so a subclass would be found before its base.
_MAPPING: tuple[tuple[type[ApplianceError], ErrorCode], ...] = (
    (BadRequest, ErrorCode.SHAPE),
    (Unsupported, ErrorCode.METHOD),
    (TooLarge, ErrorCode.MEMORY),
    (Overloaded, ErrorCode.MEMORY),
)


def from_appliance(error: ApplianceError) -> MipError:
    """Map an appliance error onto a MIP error code, keeping its message."""
    for cls, code in _MAPPING:
        if isinstance(error, cls):
            return MipError(code, error.message)
    # ModelFailed, WorkerLost, DeadlineExceeded, ModelNotReady, InternalError...
    return MipError(ErrorCode.INTERNAL, error.message)
