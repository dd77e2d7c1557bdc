import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_FP64", "dims": [2]})
        config.add_output({"name": "DOUBLED", "data_type": "TYPE_FP64", "dims": [2]})
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor(
                        "DOUBLED", 2 * pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                    )
                ]
            )
            for r in requests
        ]
