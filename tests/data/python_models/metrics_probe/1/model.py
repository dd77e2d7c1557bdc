import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "kind": "probe"}
        # Triton wants each family kept while its metrics are in use.
        self.families = [
            pb_utils.MetricFamily(
                name="probe_input_total_sum",
                description="Sum of every input",
                kind=pb_utils.MetricFamily.COUNTER,
            ),
            pb_utils.MetricFamily(
                name="probe_last_input",
                description="The last input",
                kind=pb_utils.MetricFamily.GAUGE,
            ),
            pb_utils.MetricFamily(
                name="probe_inputs",
                description="Inputs seen",
                kind=pb_utils.MetricFamily.HISTOGRAM,
            ),
        ]
        self.counter = self.families[0].Metric(labels=labels)
        self.gauge = self.families[1].Metric(labels=labels)
        self.histogram = self.families[2].Metric(labels=labels, buckets=[1.0, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            self.counter.increment(x)
            self.gauge.set(x)
            self.histogram.observe(x)
            value = np.array([self.counter.value()], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("VALUE", value)]))
        return responses
