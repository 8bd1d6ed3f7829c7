from vllm_doctor.complete import main

main()
