"""OCR preprocessing, a Triton python model: one encoded image in, the detector's input, the fitted
image and its geometry out (model_repository/ocr_pipeline.py). An unreadable or oversized image is
the client's error (INVALID_ARG, a 400), named in the answer."""

import numpy as np
import triton_python_backend_utils as pb_utils

from model_repository import ocr_pipeline as ocr


class TritonPythonModel:
    def initialize(self, args):
        pass

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy().reshape(-1)
        if images.size != 1 or not isinstance(images[0], bytes):
            return _invalid("IMAGE must hold exactly one encoded image (shape [1], BYTES)")
        try:
            fitted, geometry = ocr.fit(ocr.decode(images[0]))
            det_input = ocr.det_input(fitted)
        except ocr.ImageError as exc:
            return _invalid(str(exc))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("DET_INPUT", det_input),
            pb_utils.Tensor("FITTED", np.ascontiguousarray(fitted)),
            pb_utils.Tensor("GEOMETRY", geometry.as_array())])

    def finalize(self):
        pass


def _invalid(message):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))
