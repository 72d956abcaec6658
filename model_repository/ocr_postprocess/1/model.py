"""OCR postprocessing, a Triton python model that calls two others (BLS): the detector's map to text
boxes, each box's straightened crop, `ocr_cls` to turn upside-down lines over, `ocr_rec` on the
crops (one call per padded width, so the recogniser's dynamic batcher can put crops of many requests
in one run), and CTC decoding with the recogniser's own character list (its ONNX metadata).
model_repository/ocr_pipeline.py holds the steps."""

from pathlib import Path

import numpy as np
import onnx
import triton_python_backend_utils as pb_utils

from model_repository import ocr_pipeline as ocr

CLS_MODEL, CLS_OUTPUT = "ocr_cls", "save_infer_model/scale_0.tmp_1"
REC_MODEL, REC_OUTPUT = "ocr_rec", "softmax_11.tmp_0"
MAX_ROWS = 32  # ocr_cls's and ocr_rec's max_batch_size: a page of more lines goes in several calls


class TritonPythonModel:
    def initialize(self, args):
        self.characters = ocr.rec_characters(_metadata(Path(args["model_repository"]).parent / REC_MODEL))

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        prob_map = pb_utils.get_input_tensor_by_name(request, "PROB_MAP").as_numpy()
        fitted = pb_utils.get_input_tensor_by_name(request, "FITTED").as_numpy()
        if fitted.ndim != 3 or fitted.shape[2] != 3 or min(fitted.shape[:2]) < 1:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"FITTED must be an [H, W, 3] image, got shape {list(fitted.shape)}", pb_utils.TritonError.INVALID_ARG))
        geometry = ocr.Geometry.from_array(pb_utils.get_input_tensor_by_name(request, "GEOMETRY").as_numpy())
        found = ocr.boxes(prob_map, *fitted.shape[:2])
        lines = self._read([ocr.crop(fitted, box) for box in found]) if found else []
        keep = [i for i, (_, score) in enumerate(lines) if score >= ocr.TEXT_SCORE]
        boxes = ocr.to_original([found[i] for i in keep], geometry)
        texts = np.array([lines[i][0].encode() for i in keep], dtype=np.object_)
        scores = np.array([lines[i][1] for i in keep], dtype=np.float64)
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("BOXES", boxes), pb_utils.Tensor("TEXTS", texts), pb_utils.Tensor("SCORES", scores)])

    def _read(self, crops):
        """(text, score) per crop: upright them, then recognise them, one BLS call per padded width."""
        crops = ocr.upright(crops, _call(CLS_MODEL, ocr.cls_input(crops), CLS_OUTPUT))
        widths = ocr.rec_widths(crops)
        lines = [("", 0.0)] * len(crops)
        for width in sorted(set(widths)):
            rows = [i for i, w in enumerate(widths) if w == width]
            probs = _call(REC_MODEL, ocr.rec_input([crops[i] for i in rows], width), REC_OUTPUT)
            for i, line in zip(rows, ocr.ctc_decode(probs, self.characters), strict=True):
                lines[i] = line
        return lines

    def finalize(self):
        pass


def _call(model, x, output):
    """BLS calls of `model` on input `x`, MAX_ROWS rows at a time; an error becomes this request's."""
    parts = []
    for start in range(0, len(x), MAX_ROWS):
        response = pb_utils.InferenceRequest(model_name=model, requested_output_names=[output],
                                             inputs=[pb_utils.Tensor("x", x[start:start + MAX_ROWS])]).exec()
        if response.has_error():
            raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
        parts.append(pb_utils.get_output_tensor_by_name(response, output).as_numpy())
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _metadata(model_dir):
    """The `character` list in the newest version of the recogniser's ONNX file."""
    versions = sorted((p for p in model_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    model = onnx.load(str(versions[-1] / "model.onnx"), load_external_data=False)
    return next(p.value for p in model.metadata_props if p.key == "character")
