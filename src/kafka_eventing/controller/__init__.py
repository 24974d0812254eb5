"""The KafkaChannel controller: reconciles each channel's topic, Services, dispatcher and status.

``python -m kafka_eventing.controller`` runs it (``main.main``); ``Controller`` runs it in-process.
"""
