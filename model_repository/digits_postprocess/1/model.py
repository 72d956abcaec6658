"""Digits postprocessing, written as a classic Triton python model (TritonPythonModel + pb_utils)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        score_config = pb_utils.get_output_config_by_name(config, "SCORE")
        self.score_dtype = pb_utils.triton_string_to_numpy(score_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            probs = pb_utils.get_input_tensor_by_name(request, "PROBABILITIES").as_numpy()
            best = probs.argmax(axis=1)
            labels = np.array([[NAMES[i].encode()] for i in best], dtype=np.object_)
            scores = probs.max(axis=1, keepdims=True).astype(self.score_dtype)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("LABEL", labels), pb_utils.Tensor("SCORE", scores)]))
        return responses

    def finalize(self):
        pass
